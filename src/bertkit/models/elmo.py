"""ELMo (Peters et al. 2018): a character-CNN token encoder under a bidirectional LSTM language model.

Read top to bottom: characters -> token vectors (`CharEncoder`: embeddings, convolutions of several widths
max-pooled over the word, highway layers, a projection) -> an L-layer biLM (`BiLM`: a forward and a backward
LSTM per layer with weights of their own, projected cells, optional cell and projection clipping, residual
connections from the second layer on) -> the word softmax (`ElmoLanguageModel`, full or sampled). The token
encoder and the softmax are shared by both directions, as in allenai/bilm-tf.

Every word gets a vector from its characters alone, so words outside the softmax vocabulary are no problem for
the features. `ElmoModel` returns the layers a scalar mix reads: layer 0 is the token vector (P wide) written
twice, [x; x], so that it has the 2P width of the biLSTM layers (bilm-tf's and AllenNLP's convention); layer
k >= 1 is [forward_k; backward_k]. The forward LSTM at position t has read positions <= t only; the backward one
positions >= t only; the token layer reads the word at t alone.

Character ids (B, T, W) come from the word tokenizer (`bertkit.tokenizers.word.WordTokenizer.char_ids`): 0 pads a
word (and fills padding words), each word is <begin-of-word> chars <end-of-word>.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.config import ElmoConfig
from bertkit.models.bert import PreTrainedModel
from bertkit.models.layouts import mark_host, positions

LSTMState = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: h (B, P), c (B, lstm_dim)


@dataclass
class ElmoOutput:
    """hidden_states: layer 0 (the token layer, [x; x]) then every biLSTM layer [fwd; bwd], each (B, T, 2P);
    last_hidden_state is the last of them."""

    last_hidden_state: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...]


@dataclass
class ElmoLMOutput:
    """Summed losses (and counts) of one language-model batch; `state` the forward LSTMs' final state."""

    forward_loss: torch.Tensor
    backward_loss: torch.Tensor
    forward_count: torch.Tensor
    backward_count: torch.Tensor
    state: LSTMState | None


# ------------------------------------------------------------------------------------------------------------------
# The token encoder: characters -> one vector per word
# ------------------------------------------------------------------------------------------------------------------
class Highway(nn.Module):
    """y = g * x + (1 - g) * relu(W_t x + b_t), g = sigmoid(W_g x + b_g) (Srivastava et al.): g carries the
    input through, AllenNLP's convention; `linear` holds [W_t; W_g].

    bilm-tf writes the same layer with the other gate: its "carry" gate c = sigmoid(W_carry x + b_carry) multiplies
    the transform, c * relu(W_t x + b_t) + (1 - c) * x. So g = 1 - c, i.e. W_g = -W_carry and b_g = -b_carry,
    which is how `bertkit.checkpoint.read_bilm_weights` stores a released model's highway layers."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)
        nn.init.constant_(self.linear.bias[dim:], 1.0)  # start close to carrying the input through

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        transform, gate = self.linear(x).chunk(2, dim=-1)
        gate = torch.sigmoid(gate)
        return gate * x + (1.0 - gate) * F.relu(transform)


class CharEncoder(nn.Module):
    """(N, W) character ids -> (N, P) token vectors: embed, convolve with every filter width, max over the word,
    relu, highway layers, project."""

    def __init__(self, config: ElmoConfig) -> None:
        super().__init__()
        self.embedding = nn.Embedding(config.char_vocab_size, config.char_embedding_dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(config.char_embedding_dim, count, width)
                                   for width, count in config.filters)
        self.highways = nn.ModuleList(Highway(config.cnn_dim) for _ in range(config.num_highway))
        self.projection = nn.Linear(config.cnn_dim, config.projection_dim)

    def forward(self, chars: torch.Tensor) -> torch.Tensor:
        x = self.embedding(chars).transpose(1, 2)  # (N, E, W): channels first for Conv1d
        pooled = [conv(x).max(dim=-1).values for conv in self.convs]  # each (N, count)
        h = F.relu(torch.cat(pooled, dim=-1))  # (N, cnn_dim)
        for highway in self.highways:
            h = highway(h)
        return self.projection(h)


# ------------------------------------------------------------------------------------------------------------------
# The biLM: one LSTM per direction and layer
# ------------------------------------------------------------------------------------------------------------------
def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B, T, ...) -> each row's first lengths[b] positions reversed, the padding left in place after them.

    The backward LSTM runs forward over this, so it starts at each row's last real word, never at padding."""
    B, T = x.shape[:2]
    t = torch.arange(T, device=x.device).expand(B, T)
    index = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)  # (B, T)
    return x.gather(1, index.view(B, T, *([1] * (x.dim() - 2))).expand_as(x))


class LSTMLayer(nn.Module):
    """One direction of one layer: an LSTM with projected outputs (LSTMP), optionally clipped.

    Without clipping it runs torch's fused nn.LSTM (`proj_size` is the projection); with clipping the same
    parameters run through `step_loop` one position at a time (nn.LSTM cannot clip), which gives nn.LSTM's numbers
    when nothing reaches the clip (a test pins the two paths together).
    """

    def __init__(self, input_dim: int, config: ElmoConfig) -> None:
        super().__init__()
        proj = config.projection_dim if config.projection_dim < config.lstm_dim else 0
        self.lstm = nn.LSTM(input_dim, config.lstm_dim, batch_first=True, proj_size=proj)
        self.cell_clip, self.proj_clip = config.cell_clip, config.proj_clip
        self.out_dim = proj or config.lstm_dim

    def zero_state(self, batch: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (like.new_zeros(batch, self.out_dim), like.new_zeros(batch, self.lstm.hidden_size))

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None,
                lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x (B, T, D), state (h (B, P), c (B, H)) or None (zeros) -> outputs (B, T, P), the state after T.

        With `lengths` (B,), row b's state is the one after its lengths[b] real positions (the padding after them
        is not read into it; a row of length 0 keeps `state`), as a stateful reader carries it to the next batch;
        the outputs at real positions are the same either way."""
        if state is None:
            state = self.zero_state(x.shape[0], x)
        if self.cell_clip is None and self.proj_clip is None:
            h0, c0 = state[0][None].contiguous(), state[1][None].contiguous()
            if lengths is None:
                out, (h, c) = self.lstm(x, (h0, c0))
                return out, (h[0], c[0])
            # packed rows stop at their own length; a row of length 0 cannot be packed: it runs one step, and
            # its old state is put back below
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True,
                                                       enforce_sorted=False)
            out, (h, c) = self.lstm(packed, (h0, c0))
            out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
            empty = lengths.eq(0)[:, None]
            return out, (torch.where(empty, state[0], h[0]), torch.where(empty, state[1], c[0]))
        return self.step_loop(x, state, self.cell_clip, self.proj_clip, lengths)

    def step_loop(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor], cell_clip: float | None,
                  proj_clip: float | None, lengths: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The LSTMP recurrence written out (torch's gate order i, f, g, o), clipping c and the projected h; with
        `lengths` a row's state stops changing after its last real position."""
        lstm = self.lstm
        h, c = state
        inputs = F.linear(x, lstm.weight_ih_l0, lstm.bias_ih_l0)  # (B, T, 4H): the input half of every gate at once
        outs = []
        for t in range(x.shape[1]):
            gates = inputs[:, t] + F.linear(h, lstm.weight_hh_l0, lstm.bias_hh_l0)
            i, f, g, o = gates.chunk(4, dim=-1)
            c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            if cell_clip is not None:
                c_new = c_new.clamp(-cell_clip, cell_clip)
            h_new = torch.sigmoid(o) * torch.tanh(c_new)
            if lstm.proj_size:
                h_new = F.linear(h_new, lstm.weight_hr_l0)
            if proj_clip is not None:
                h_new = h_new.clamp(-proj_clip, proj_clip)
            outs.append(h_new)
            if lengths is None:
                h, c = h_new, c_new
            else:
                real = (t < lengths)[:, None]  # (B, 1): padding leaves the state as the last real word left it
                h, c = torch.where(real, h_new, h), torch.where(real, c_new, c)
        return torch.stack(outs, dim=1), (h, c)


class BiLM(nn.Module):
    """L layers of a forward and a backward LSTM (separate weights); layer k >= 2 adds its input to its output
    (bilm-tf's skip connections) when `residual`; dropout on every layer's input while training."""

    def __init__(self, config: ElmoConfig) -> None:
        super().__init__()
        P = config.projection_dim
        self.forward_layers = nn.ModuleList(LSTMLayer(P, config) for _ in range(config.num_layers))
        self.backward_layers = nn.ModuleList(LSTMLayer(P, config) for _ in range(config.num_layers))
        self.residual = config.residual
        self.dropout = nn.Dropout(config.dropout)

    def run(self, layers: nn.ModuleList, x: torch.Tensor, state: LSTMState | None,
            lengths: torch.Tensor | None = None) -> tuple[list[torch.Tensor], LSTMState]:
        """One direction over x (B, T, P) -> every layer's outputs (B, T, P) and every layer's final state (after
        each row's `lengths` real positions when given, else after T)."""
        outputs, final = [], []
        for k, layer in enumerate(layers):
            out, last = layer(self.dropout(x), None if state is None else state[k], lengths)
            if self.residual and k > 0:
                out = out + x
            outputs.append(out)
            final.append(last)
            x = out
        return outputs, final

    def directions(self, tokens: torch.Tensor, lengths: torch.Tensor, state: LSTMState | None = None,
                   backward_state: LSTMState | None = None, final_states: bool = False
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor], LSTMState, LSTMState]:
        """tokens (B, T, P), lengths (B,) -> (forward outputs, backward outputs in text order, forward state,
        backward state). Each direction starts from its state (None: zeros). With `final_states` the states
        returned are each row's after its own real words (the forward LSTM's after the last word, the backward
        LSTM's after the first: where each would go on reading the next batch's row), else after T positions."""
        upto = lengths if final_states else None
        forward, final = self.run(self.forward_layers, tokens, state, upto)
        backward, back_final = self.run(self.backward_layers, reverse_padded(tokens, lengths), backward_state, upto)
        return forward, [reverse_padded(b, lengths) for b in backward], final, back_final


# ------------------------------------------------------------------------------------------------------------------
# The models
# ------------------------------------------------------------------------------------------------------------------
class ElmoPreTrainedModel(PreTrainedModel):
    config_class = ElmoConfig  # what `from_pretrained` reads config.json as
    encoder_prefix = ""

    def init_weights(self) -> None:
        """torch's own initialisation (uniform by fan-in) for the convolutions and LSTMs; N(0, 1/sqrt(P)) for the
        softmax, zero biases."""
        for module in self.modules():
            if isinstance(module, nn.Embedding):
                nn.init.uniform_(module.weight, -1.0, 1.0)
                if module.padding_idx is not None:
                    with torch.no_grad():
                        module.weight[module.padding_idx].zero_()


class ElmoModel(ElmoPreTrainedModel):
    """Characters -> the layers of ELMo: the token layer and every biLSTM layer, each (B, T, 2P).

    stateful=False (the default): every batch starts both directions' LSTMs from zeros, so a sentence's layers do
    not depend on what came before. stateful=True reads a stream of batches as bilm-tf and AllenNLP's `Elmo` do:
    row b of a batch starts each LSTM (forward and backward, every layer) from the state row b of the previous
    batch left it (the forward LSTM's after that row's last word, the backward one's after its first); rows beyond
    the previous batch's start from zeros, a row without words keeps its state. `reset_states()` starts over."""

    architecture = "ElmoModel"

    def __init__(self, config: ElmoConfig, stateful: bool = False) -> None:
        super().__init__()
        self.config = config
        self.char_cnn = CharEncoder(config)
        self.bilm = BiLM(config)
        self.stateful = stateful
        self.states: tuple[LSTMState, LSTMState] | None = None  # (forward, backward) per layer, rows = widest batch
        self.init_weights()

    def reset_states(self) -> None:
        """Forget the carried LSTM states: the next batch starts from zeros."""
        self.states = None

    def tokens(self, chars: torch.Tensor) -> torch.Tensor:
        """(B, T, W) character ids -> (B, T, P) context-free token vectors."""
        B, T, W = chars.shape
        return self.char_cnn(chars.reshape(B * T, W)).view(B, T, -1)

    def forward(self, chars: torch.Tensor, attention_mask: torch.Tensor | None = None) -> ElmoOutput:
        """chars: (B, T, W) int64 character ids; attention_mask: (B, T), 1 on words, 0 on trailing padding."""
        B, T, _ = chars.shape
        if attention_mask is None:
            attention_mask = chars.ne(0).any(-1).long()
        lengths = attention_mask.ne(0).sum(-1)
        tokens = self.tokens(chars)
        if self.stateful:
            start = self._carried(B)
            forward, backward, fwd_state, bwd_state = self.bilm.directions(tokens, lengths, *start,
                                                                           final_states=True)
            self._carry(fwd_state, bwd_state)
        else:
            forward, backward, _, _ = self.bilm.directions(tokens, lengths)
        keep = attention_mask.ne(0)[..., None].to(tokens.dtype)  # padding positions give zeros in every layer
        layers = [torch.cat([tokens, tokens], dim=-1) * keep]
        layers += [torch.cat([f, b], dim=-1) * keep for f, b in zip(forward, backward)]
        return ElmoOutput(layers[-1], tuple(layers))

    def _carried(self, batch: int) -> tuple[LSTMState | None, LSTMState | None]:
        """The states the first `batch` rows start from (zeros past the rows carried so far)."""
        if self.states is None:
            return None, None
        out = []
        for direction in self.states:
            rows = direction[0][0].shape[0]
            out.append([(F.pad(h[:batch], (0, 0, 0, max(0, batch - rows))),
                         F.pad(c[:batch], (0, 0, 0, max(0, batch - rows)))) for h, c in direction])
        return out[0], out[1]

    def _carry(self, forward: LSTMState, backward: LSTMState) -> None:
        """Keep this batch's final states for its rows; rows past this batch keep theirs."""
        new = ([(h.detach(), c.detach()) for h, c in forward], [(h.detach(), c.detach()) for h, c in backward])
        if self.states is not None and self.states[0][0][0].shape[0] > new[0][0][0].shape[0]:
            batch = new[0][0][0].shape[0]
            new = tuple([(torch.cat([h, old_h[batch:]]), torch.cat([c, old_c[batch:]]))
                         for (h, c), (old_h, old_c) in zip(mine, theirs)] for mine, theirs in zip(new, self.states))
        self.states = new


def log_uniform_samples(vocab_size: int, count: int, generator: torch.Generator | None = None,
                        device: torch.device | str = "cpu") -> torch.Tensor:
    """`count` word ids drawn from the log-uniform (Zipfian) distribution over ids sorted by frequency, TF's
    `log_uniform_candidate_sampler`: P(k) = log((k + 2) / (k + 1)) / log(V + 1)."""
    u = torch.rand(count, generator=generator, device=device, dtype=torch.float64)
    return (torch.exp(u * math.log(vocab_size + 1)).floor().long() - 1).clamp(0, vocab_size - 1)


def log_uniform_log_prob(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """log P(k) of the log-uniform sampler above, for each id."""
    k = ids.double()
    return (torch.log((k + 2) / (k + 1)) / math.log(vocab_size + 1)).log().float()


def _both_real(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T+1) mask -> (B, T) bool: words t and t + 1 are both real (a pair the biLM predicts, either way)."""
    real = attention_mask != 0
    return real[:, 1:] & real[:, :-1]


class ElmoLanguageModel(ElmoPreTrainedModel):
    """ELMo with its word softmax, shared by both directions: the forward LSTM at t predicts word t + 1, the
    backward LSTM at t predicts word t - 1. What pretraining trains and saves."""

    architecture = "ElmoLanguageModel"
    head_family = "lm"
    encoder_prefix = "elmo."

    def __init__(self, config: ElmoConfig) -> None:
        super().__init__()
        self.config = config
        self.elmo = ElmoModel(config)
        self.softmax = nn.Linear(config.projection_dim, config.vocab_size)
        self.dropout = nn.Dropout(config.dropout)
        self.init_softmax()

    def init_softmax(self) -> None:
        nn.init.normal_(self.softmax.weight, std=1.0 / math.sqrt(self.config.projection_dim))
        nn.init.zeros_(self.softmax.bias)

    def word_loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Summed cross-entropy of (N, P) outputs against (N,) word ids: the full softmax, or while training with
        config.sampled_softmax > 0 the sampled one (true word against that many log-uniform samples, their logits
        corrected by log expected counts, accidental hits removed)."""
        hidden = self.dropout(hidden)
        S, V = self.config.sampled_softmax, self.config.vocab_size
        if not (self.training and S > 0):
            return F.cross_entropy(self.softmax(hidden).float(), targets, reduction="sum")
        samples = log_uniform_samples(V, S, device=hidden.device)  # (S,)
        weight, bias = self.softmax.weight, self.softmax.bias
        true_logit = (hidden * weight[targets]).sum(-1) + bias[targets] - (
            log_uniform_log_prob(targets, V) + math.log(S))  # (N,)
        sampled = hidden @ weight[samples].T + bias[samples] - (log_uniform_log_prob(samples, V) + math.log(S))
        sampled = sampled.masked_fill(samples[None, :] == targets[:, None], float("-inf"))  # (N, S)
        logits = torch.cat([true_logit[:, None], sampled], dim=-1).float()
        return F.cross_entropy(logits, torch.zeros_like(targets), reduction="sum")

    def forward(self, chars: torch.Tensor, word_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                state: LSTMState | None = None) -> ElmoLMOutput:
        """A window of T + 1 words: the forward LSTMs read words 0..T-1 (from `state`, or zeros) and predict
        1..T; the backward LSTMs read words T..1 and predict T-1..0.

        chars: (B, T+1, W); word_ids: (B, T+1) the softmax targets; attention_mask: (B, T+1), padding 0 at the end
        of rows (a padded word is never a target). Returns summed losses with their counts and the forward state
        after word T-1, which is where the next window (starting at word T) continues.
        """
        if attention_mask is None:
            attention_mask = torch.ones_like(word_ids)
        real = attention_mask.ne(0)
        tokens = self.elmo.tokens(chars)  # (B, T+1, P), computed once for both directions
        bilm = self.elmo.bilm
        forward, final = bilm.run(bilm.forward_layers, tokens[:, :-1], state)
        lengths = real[:, 1:].sum(-1)
        backward, _ = bilm.run(bilm.backward_layers, reverse_padded(tokens[:, 1:], lengths), None)
        backward_top = reverse_padded(backward[-1], lengths)  # (B, T, P) in text order: position t is word t + 1
        # Predict word t + 1 from t (forward) and t from t + 1 (backward) where both are real: the same positions,
        # found from the mask's host copy where it has one (no device read)
        keep = mark_host(_both_real(attention_mask), attention_mask, _both_real)  # (B, T)
        at = positions(keep)  # (N,) flat b * T + t
        fwd_loss = self.word_loss(forward[-1].flatten(0, 1).index_select(0, at),
                                  word_ids[:, 1:].reshape(-1).index_select(0, at))
        bwd_loss = self.word_loss(backward_top.flatten(0, 1).index_select(0, at),
                                  word_ids[:, :-1].reshape(-1).index_select(0, at))
        count = keep.sum().float()
        return ElmoLMOutput(fwd_loss, bwd_loss, count, count,
                            [(h.detach(), c.detach()) for h, c in final])
