"""ModernBERT: token embeddings -> pre-norm layers (rotary attention, global or sliding-window; GeGLU) -> final norm,
and its masked-LM, sequence-classification, token-classification, multiple-choice and question-answering heads.

Read it top to bottom: rotary helpers, the embedding block, attention (with the sliding window), the feed-forward
block, one layer, the heads, then the models. Shapes use B = batch, T = sequence length, N = real tokens (the
unpadded layout), H = hidden size, A = attention heads, D = H / A (head size), I = intermediate size,
V = vocabulary size.

Where ModernBERT departs from BERT (`models/bert.py`), each where it acts:

    positions     no position table: rotary embeddings turn each query and key by position x frequency, with the
                  base `global_rope_theta` in global layers and `local_rope_theta` in sliding-window layers
    attention     layer i is global when i % global_attn_every_n_layers == 0; the others let a token see only the
                  tokens at distance <= local_attention // 2 on either side (the sliding window)
    pre-norm      x + attn(norm(x)), then x + mlp(norm(x)); layer 0 has no attention norm (its input is the normed
                  embedding), and a final norm follows the last layer; LayerNorms have no bias unless `norm_bias`
    GeGLU         Wi: H -> 2I, split into input and gate, act(input) * gate, Wo: I -> H
    heads         dense -> act -> norm (the prediction head), then the decoder tied to the token embeddings (MLM)
                  or dropout -> classifier; sequence classification and multiple choice pool the first token or
                  the mean of the real tokens (`classifier_pooling`); question answering scores every token
    no segments   there are no token types; `token_type_ids` is accepted (the verbs pass it) and ignored

The fast path, as in BERT: a batch with padding runs on its real tokens only (`Unpadded`, a flat (N, H) tensor,
attention per sequence; `ModernBertModel.unpad`), the sliding window then applied within each sequence by
`SlidingWindow`. Packed rows (an attention mask numbering documents 1, 2, ..., as pretraining with
`isolate_documents` makes them) run each document as its own sequence, its rotary positions restarting at 0.
tests/models/test_modernbert.py pins the unpadded path to the padded one and both to transformers.

Inside, modules carry short names of our own; on disk a model directory has transformers' ModernBERT names and
config.json, through the "modernbert" table of `bertkit.checkpoint`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.config import ModernBertConfig
from bertkit.models.bert import (BertOutput, PreTrainedModel, PreTrainingOutput, TaskOutput, exporting, sequence_loss,
                                 token_loss)
from bertkit.models.heads import NamedLabels, span_loss
from bertkit.models.kernels import Linear, activation, linear
from bertkit.models import layouts as layout_rules
from bertkit.models.layouts import (Encoded, FillSlots, Padded, ReadSlots, Unpadded, attention_bias, check_ids,
                                    check_ids_in_vocabulary, host_copy, varlen_flash, varlen_kernel_available)


# ------------------------------------------------------------------------------------------------------------------
# Rotary position embeddings
# ------------------------------------------------------------------------------------------------------------------
def rotary_angles(positions: torch.Tensor, theta: float, head_dim: int,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions (...) -> the cosine and sine of every angle, (..., D) each, in `dtype`.

    Dimension pair k turns at frequency theta^(-2k/D); the two halves of the head repeat the same D/2 angles
    (transformers' `rotate_half` convention, not interleaved pairs). Angles are computed in float32 whatever
    `dtype`, as in transformers; the frequencies on the CPU, so every device turns by the same angles.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))  # (D/2,)
    freqs = positions[..., None].float() * inv_freq.to(positions.device)  # (..., D/2)
    angles = torch.cat((freqs, freqs), dim=-1)  # (..., D)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_queries_and_keys(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int) -> torch.Tensor:
    """qkv (..., 3H) queries, keys and values side by side; cos, sin (..., D) per position -> the same layout
    with queries and keys turned by their position's angles (values untouched). Computed in float32."""
    *lead, H3 = qkv.shape
    parts = qkv.view(*lead, 3, num_heads, H3 // (3 * num_heads))  # (..., 3, A, D)
    qk = parts[..., :2, :, :].float()  # (..., 2, A, D)
    cos, sin = cos[..., None, None, :], sin[..., None, None, :]  # (..., 1, 1, D): one angle for q and k, all heads
    half = qk.shape[-1] // 2
    rotated_half = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)  # (x1, x2) -> (-x2, x1)
    turned = (qk * cos + rotated_half * sin).to(qkv.dtype)
    return torch.cat((turned, parts[..., 2:, :, :]), dim=-3).reshape(*lead, H3)


# ------------------------------------------------------------------------------------------------------------------
# Attention layouts with the sliding window
# ------------------------------------------------------------------------------------------------------------------
def window_bias(attention_mask: torch.Tensor | None, window: int, positions: torch.Tensor, dtype: torch.dtype,
                packed: bool = False) -> torch.Tensor | None:
    """The padded path's additive mask for a sliding-window layer: (B or 1, 1, T, T), 0 where key j is at position
    distance <= window of query i and is a real token (of query i's document when `packed`), the dtype's minimum
    elsewhere; None when nothing is hidden.

    positions: (T,) or (B, T) each token's position (packed rows restart at every document's first token).
    """
    p = positions if positions.dim() == 2 else positions[None]  # (B or 1, T)
    near = (p[:, :, None] - p[:, None, :]).abs() <= window  # (B or 1, T, T)
    if attention_mask is None:
        if bool(near.all()):
            return None
        allowed = near[:, None]  # (B or 1, 1, T, T)
    elif packed:  # a token sees the tokens of its own document only
        m = attention_mask
        allowed = (near & (m[:, :, None] == m[:, None, :]) & (m[:, None, :] > 0))[:, None]  # (B, 1, T, T)
    else:
        allowed = near[:, None] & attention_mask.bool()[:, None, None, :]  # (B, 1, T, T)
    return torch.zeros(allowed.shape, dtype=dtype, device=p.device).masked_fill(~allowed, torch.finfo(dtype).min)


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """A packed attention mask (B, T) numbering documents 1, 2, ... (0 = padding) -> (B, T) positions that restart
    at every document's first token, so each document is turned by the angles it would get alone in its row."""
    B, T = documents.shape
    t = torch.arange(T, device=documents.device).expand(B, T)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    return t - torch.where(starts, t, 0).cummax(dim=1).values  # (B, T): distance to the document's first token


class SlidingWindow:
    """A sliding-window layer's view of an `Unpadded` layout: the same flat (N, H) tokens and attention groups,
    each query seeing only the keys of its own sequence at position distance <= `window`.

    Positions are the tokens' places in their padded row, so the window is the padded path's exactly, whatever the
    padding. A variable-length FlashAttention kernel (GPU) takes the window as a distance within the sequence,
    the same thing when every sequence's tokens are contiguous in their row; it is used only then.
    """

    def __init__(self, tokens: Unpadded, positions: torch.Tensor, window: int) -> None:
        """tokens: the layout; positions: (N,) each token's position; window: how far a token sees either side."""
        self.tokens, self.window = tokens, window
        slot_position = positions.new_zeros(tokens.total).index_copy(0, tokens.slot, positions)  # (total,)
        real = torch.zeros(tokens.total, dtype=torch.bool, device=positions.device)
        real[tokens.slot] = True
        self.masks: list[torch.Tensor] = []  # per group (S_g, 1, L_g, L_g) bool, True = attended
        offset = 0
        for S_g, L_g, key_mask in tokens.layout:
            p = slot_position[offset:offset + S_g * L_g].view(S_g, L_g)
            r = real[offset:offset + S_g * L_g].view(S_g, L_g)
            near = (p[:, :, None] - p[:, None, :]).abs() <= window  # (S_g, L_g, L_g)
            # An empty slot's query row sees every real key instead: a fully hidden row would be NaN in the kernel
            # (and in its gradient), though nothing reads that row.
            self.masks.append(key_mask & (near | ~r[:, :, None])[:, None])
            offset += S_g * L_g
        self.contiguous = varlen_kernel_available(positions) and _contiguous(tokens, positions)
        self._biases: list[torch.Tensor] | None = None

    def attend(self, qkv: torch.Tensor, num_heads: int, dropout: float) -> torch.Tensor:
        """qkv: (N, 3H) queries, keys and values side by side -> context (N, H); as `Unpadded.attend`, windowed."""
        tokens = self.tokens
        N, H = qkv.shape[0], qkv.shape[1] // 3
        if self.contiguous:
            context = varlen_flash(qkv, num_heads, tokens.cu_seqlens, tokens.max_len, dropout, window=self.window)
            if context is not None:
                return context
        laid_out = FillSlots.apply(qkv, tokens.slot, tokens.total, tokens.empty)  # (total, 3H)
        masks = self.masks if dropout > 0 else self.biases(qkv.dtype)  # the math kernel is fastest with bool masks
        contexts = []
        parts = laid_out.split([S_g * L_g for S_g, L_g, _ in tokens.layout])
        for (S_g, L_g, _), part, mask in zip(tokens.layout, parts, masks):
            heads = part.view(S_g, L_g, 3, num_heads, H // num_heads).permute(2, 0, 3, 1, 4)  # (3, S_g, A, L_g, D)
            q, k, v = heads.unbind(0)
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
            contexts.append(context.transpose(1, 2).reshape(S_g * L_g, H))
        context = contexts[0] if len(contexts) == 1 else torch.cat(contexts)
        return ReadSlots.apply(context, tokens.slot)

    def biases(self, dtype: torch.dtype) -> list[torch.Tensor]:
        """The masks as additive masks (0 or the dtype's minimum), built once per dtype."""
        if self._biases is None or self._biases[0].dtype != dtype:
            low = torch.finfo(dtype).min
            self._biases = [torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, low)
                            for m in self.masks]
        return self._biases


def _contiguous(tokens: Unpadded, positions: torch.Tensor) -> bool:
    """Whether every sequence's tokens hold consecutive positions (no hole in its attention mask)."""
    steps = positions[1:] - positions[:-1]  # (N - 1,) between token i and i + 1 of the flat order
    inner = torch.ones_like(steps, dtype=torch.bool)
    inner[tokens.cu_seqlens[1:-1].long() - 1] = False  # pairs that straddle two sequences
    return bool((steps[inner] == 1).all())


# ------------------------------------------------------------------------------------------------------------------
# Blocks
# ------------------------------------------------------------------------------------------------------------------
def layer_norm(config: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class Embeddings(nn.Module):
    """Token embeddings, then LayerNorm and dropout: no positions (rotary, in attention) and no token types."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        # padding_idx: the padding row gets no gradient, as in transformers (its value is whatever was loaded).
        self.word = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = layer_norm(config)
        self.dropout = nn.Dropout(config.embedding_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) or flat (N,) ids -> (..., H)."""
        return self.dropout(self.norm(self.word(input_ids)))


class Attention(nn.Module):
    """Multi-head self-attention with rotary queries and keys, global or sliding-window by the layout it is given.

    No residual and no norm here: the layer adds the output to its input (pre-norm). transformers applies the
    attention dropout probability twice: to the attention probabilities and to the output projection.
    """

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        H = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.qkv = Linear(H, 3 * H, bias=config.attention_bias)  # rows: query, key, value (transformers' Wqkv)
        self.out = Linear(H, H, bias=config.attention_bias)
        self.attn_dropout = config.attention_dropout
        self.dropout = nn.Dropout(config.attention_dropout)

    def forward(self, x: torch.Tensor, layout: Padded | Unpadded | SlidingWindow,
                rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x: (B, T, H) padded or (N, H) unpadded; rotary: cos, sin of x's positions, (T or N, D)."""
        qkv = rotate_queries_and_keys(self.qkv(x), *rotary, self.num_heads)  # (..., 3H)
        context = layout.attend(qkv, self.num_heads, self.attn_dropout if self.training else 0.0)  # (..., H)
        return self.dropout(self.out(context))


class FeedForward(nn.Module):
    """GeGLU: Wi (H -> 2I) split into input and gate, act(input) * gate, dropout, Wo (I -> H)."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.up = Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = activation(config.hidden_activation)
        self.dropout = nn.Dropout(config.mlp_dropout)
        self.down = Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.up(x).chunk(2, dim=-1)  # (..., I) each: the first half is activated, the second gates
        return self.down(self.dropout(self.act(value) * gate))


class Layer(nn.Module):
    """One pre-norm layer: x + attn(norm(x)), then x + ffn(norm(x)). Layer 0's input is already normed (the
    embedding norm), so it has no attention norm."""

    def __init__(self, config: ModernBertConfig, index: int) -> None:
        super().__init__()
        self.attn_norm = layer_norm(config) if index else nn.Identity()
        self.attn = Attention(config)
        self.ffn_norm = layer_norm(config)
        self.ffn = FeedForward(config)
        self.kind = "global" if config.is_global(index) else "local"

    def forward(self, x: torch.Tensor, layouts: dict, rotary: dict) -> torch.Tensor:
        """layouts, rotary: the attention layout and the (cos, sin) pair of each kind, "global" and "local"."""
        x = x + self.attn(self.attn_norm(x), layouts[self.kind], rotary[self.kind])
        return x + self.ffn(self.ffn_norm(x))


class PredictionHead(nn.Module):
    """dense -> activation -> LayerNorm: the transform before the MLM decoder and before the classifiers."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = activation(config.classifier_activation)
        self.norm = layer_norm(config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(hidden)))


class MaskedLMHead(PredictionHead):
    """The prediction head, then scores over the vocabulary with the token embeddings (tied) and the decoder bias."""

    onednn: bool | str = "auto"  # the decoder's matmul kernel (`linear`: measured choice; True oneDNN; False plain)

    def __init__(self, config: ModernBertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.decoder_bias else None
        self.word_embeddings = word_embeddings  # shared module, not a copy: the decoder is tied to it

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return linear(super().forward(hidden), self.word_embeddings.weight, self.bias, self.onednn)  # (..., V)


# ------------------------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------------------------
class ModernBertPreTrainedModel(PreTrainedModel):
    """ModernBERT's initialisation; model-directory io (`from_pretrained`, `save_pretrained`) is bertkit's."""

    config: ModernBertConfig
    config_class = ModernBertConfig  # what `from_pretrained` reads config.json as (a BERT directory is refused)
    encoder_prefix = "encoder."  # where the encoder sits in the task models' parameter names

    def init_weights(self) -> None:
        """ModernBERT's scheme: truncated normals cut at +- initializer_cutoff_factor std; std initializer_range
        for the embeddings and the layers' input projections, initializer_range / sqrt(2L) for the projections
        back into the residual stream and the prediction head, H^-0.5 for classifiers; zero biases, unit norms."""
        config = self.config
        std = config.initializer_range
        out_std = std / math.sqrt(2.0 * config.num_hidden_layers)

        def normal(weight: torch.Tensor, sd: float) -> None:
            cut = config.initializer_cutoff_factor * sd
            nn.init.trunc_normal_(weight, mean=0.0, std=sd, a=-cut, b=cut)

        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, Embeddings):
                normal(module.word.weight, std)
            elif isinstance(module, (Attention, FeedForward)):
                normal((module.qkv if isinstance(module, Attention) else module.up).weight, std)
                normal((module.out if isinstance(module, Attention) else module.down).weight, out_std)
            elif isinstance(module, PredictionHead):
                normal(module.dense.weight, out_std)
                if isinstance(module, MaskedLMHead) and module.bias is not None:
                    nn.init.zeros_(module.bias)
        classifier = getattr(self, "classifier", None)
        if isinstance(classifier, nn.Linear):
            normal(classifier.weight, config.hidden_size ** -0.5)


class ModernBertModel(ModernBertPreTrainedModel):
    """The encoder: token ids -> contextual vectors (B, T, H). No pooler: classifiers pool in their head."""

    architecture = "ModernBertModel"
    encoder_prefix = ""
    unpad = True  # run on the real tokens only when a batch has padding (False: the plain padded path)

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = layer_norm(config)  # the final norm
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False) -> BertOutput:
        """input_ids: (B, T) integer tensor; attention_mask (B, T): 1 = real token, 0 = padding, or for packed rows
        the document number 1, 2, ... of each token (attention then stays within a document and rotary positions
        restart at its first token, as if each document were alone in its row); token_type_ids: ignored
        (ModernBERT has no segments).

        Returns `last_hidden_state` (B, T, H), after the final norm, and with `output_hidden_states` L + 1 tensors:
        the embeddings, the output of layers 1 .. L-1, and the last one after the final norm (transformers'
        convention). With the unpadded layout (the default) padding positions hold 0; real positions are what
        transformers computes.
        """
        out = self.encode(input_ids, attention_mask, output_hidden_states)
        return BertOutput(out.padded(), None, out.hidden_states)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               output_hidden_states: bool = False) -> Encoded:
        """The encoder's output in the layout it ran in (see `Encoded`); `forward` pads it back to (B, T, H).

        Without padding, (B, T, H) with only the sliding window as a mask; with padding or packed rows, the real
        tokens only (`Unpadded`, one sequence per row or per document) when `self.unpad`, else (B, T, H) with
        additive masks (the plain path).
        """
        config = self.config
        check_inputs(config, input_ids, attention_mask)
        B, T = input_ids.shape
        device = input_ids.device
        packed, full = False, attention_mask is None or not attention_mask.numel()
        host = host_copy(attention_mask)
        if attention_mask is not None and attention_mask.numel() and not exporting():  # traced: a 0/1 padding mask
            # From the batch's host copy where the loop attached one (no device read); else a device sync
            low, high = (int(v) for v in (attention_mask if host is None else host).aminmax())
            packed, full = high > 1, low >= 1 and high == 1
        # Padding keeps its place, as in transformers; packed rows restart at every document.
        positions = document_positions(attention_mask) if packed else torch.arange(T, device=device)  # (B, T) | (T,)
        tokens = None
        if full or not self.unpad:
            mask = None if full else attention_mask
            bias = None if full else attention_bias(mask, False, T, self.dtype, device, packed)
            layouts = {"global": Padded(bias),
                       "local": Padded(window_bias(mask, config.sliding_window, positions, self.dtype, packed))}
            x = self.embeddings(input_ids)  # (B, T, H)
        else:
            tokens = Unpadded.build(attention_mask, packed, False, host)  # sizes from the host copy
            positions = tokens.gather(positions)  # (N,)
            layouts = {"global": tokens, "local": SlidingWindow(tokens, positions, config.sliding_window)}
            x = self.embeddings(tokens.gather(input_ids))  # (N, H)
        rotary = {"global": rotary_angles(positions, config.global_rope_theta, config.head_dim, x.dtype),
                  "local": rotary_angles(positions, config.local_rope_theta, config.head_dim, x.dtype)}
        hidden_states = [x] if output_hidden_states else None
        for layer in self.layers:
            x = layer(x, layouts, rotary)
            if hidden_states is not None:
                hidden_states.append(x)
        x = self.norm(x)
        if hidden_states is not None:
            hidden_states[-1] = x  # transformers reports the last layer after the final norm
            if tokens is not None:
                hidden_states = [tokens.pad(h) for h in hidden_states]
        return Encoded(x, tokens, tuple(hidden_states) if hidden_states is not None else None)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype masks are built in: that of the parameters (autocast keeps them float32)."""
        return self.embeddings.word.weight.dtype


class ModernBertForMaskedLM(ModernBertPreTrainedModel):
    """The encoder and the masked-LM head (transformers' ModernBertForMaskedLM); the BertForMaskedLM contract, so
    the MLM objective and fill-mask take it as they take a BERT."""

    architecture = "ModernBertForMaskedLM"
    head_family = "mlm"
    requires_pretrained_heads = True

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = ModernBertModel(config)
        self.mlm = MaskedLMHead(config, self.encoder.embeddings.word)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_hidden_states: bool = False, predict_at: torch.Tensor | None = None) -> PreTrainingOutput:
        """labels: (B, T) original ids at masked positions, IGNORE_INDEX elsewhere.

        predict_at: optional (B, T) bool; the vocabulary projection then runs only there and `prediction_logits`
        is (n, V) for the n selected positions in row-major order (else (B, T, V)).
        """
        out = self.encoder.encode(input_ids, attention_mask, output_hidden_states)
        if predict_at is not None:
            hidden = out.select(predict_at)  # (n, H)
            if labels is not None:
                labels = labels[predict_at]
        else:
            hidden = out.padded()  # (B, T, H)
        logits = self.mlm(hidden)  # (B, T, V) or (n, V)
        loss = token_loss(logits, labels)
        return PreTrainingOutput(loss, logits, None, loss, None, out.hidden_states)


class _Labelled(NamedLabels, ModernBertPreTrainedModel):
    """Shared by the classifiers: the prediction head, dropout and a linear layer to `num_labels` named labels."""

    head_family = "classifier"

    def __init__(self, config: ModernBertConfig, num_labels: int, labels: list[str] | None, regression: bool) -> None:
        super().__init__()
        self.set_labels(config, num_labels, labels, regression)
        self.encoder = ModernBertModel(config)
        self.head = PredictionHead(config)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = Linear(config.hidden_size, num_labels)
        self.init_weights()


class ModernBertForSequenceClassification(_Labelled):
    """Pool (first token, or mean of the real tokens) -> prediction head -> dropout -> linear: classification
    (cross-entropy) or, with one output, regression (mean squared error)."""

    architecture = "ModernBertForSequenceClassification"

    def __init__(self, config: ModernBertConfig, num_labels: int = 2, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__(config, num_labels, labels, regression or num_labels == 1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """labels: (B,) class ids, or (B,) floats for regression."""
        logits = self.scores(self.encoder.encode(input_ids, attention_mask), attention_mask)  # (B, num_labels)
        return TaskOutput(sequence_loss(logits, labels, self.regression), logits)

    def scores(self, out: Encoded, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The encoder's output -> logits (B, num_labels): what `forward` computes after the encoder (distillation
        runs the encoder itself, for its hidden states, and then this)."""
        return self.classifier(self.dropout(self.head(pool(self.config, out, attention_mask))))


class ModernBertForTokenClassification(_Labelled):
    """Every token -> prediction head -> dropout -> linear (NER, tagging); labels IGNORE_INDEX where none applies."""

    architecture = "ModernBertForTokenClassification"

    def __init__(self, config: ModernBertConfig, num_labels: int = 2, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__(config, num_labels, labels, False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """labels: (B, T) label ids, IGNORE_INDEX where no label applies. logits (B, T, num_labels)."""
        logits = self.scores(self.encoder.encode(input_ids, attention_mask), attention_mask)
        return TaskOutput(token_loss(logits, labels), logits)

    def scores(self, out: Encoded, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The encoder's output -> logits (B, T, num_labels), as `forward` computes them after the encoder."""
        return self.classifier(self.dropout(self.head(out.padded())))


class ModernBertForMultipleChoice(_Labelled):
    """One score per (context, choice) pair (SWAG), softmax over the choices: each pair is pooled as a sequence
    classifier pools (its first real token, or the mean of its real tokens) -> prediction head -> dropout -> linear
    to one output (transformers' ModernBertForMultipleChoice)."""

    architecture = "ModernBertForMultipleChoice"
    named_labels = False

    def __init__(self, config: ModernBertConfig, num_labels: int = 1, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__(config, 1, None, False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """input_ids, attention_mask: (B, C, T) for C choices; labels: (B,) the right choice. logits (B, C)."""
        B, C, T = input_ids.shape
        mask = None if attention_mask is None else layout_rules.reshape(attention_mask, B * C, T)  # host copy kept
        out = self.encoder.encode(input_ids.reshape(B * C, T), mask)
        # transformers pools a choice's first *real* token here (its sequence classifier: position 0).
        pooled = pool(self.config, out, mask, first_real=True)  # (B * C, H)
        logits = self.classifier(self.dropout(self.head(pooled))).view(B, C)  # (B, C)
        return TaskOutput(sequence_loss(logits, labels), logits)


class ModernBertForQuestionAnswering(ModernBertPreTrainedModel):
    """Extractive QA: every token -> prediction head -> dropout -> linear to a start and an end score (SQuAD);
    position 0 ([CLS]) means no answer. transformers' ModernBertForQuestionAnswering (its `classifier` has the
    two outputs)."""

    architecture = "ModernBertForQuestionAnswering"
    head_family = "qa"

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = ModernBertModel(config)
        self.head = PredictionHead(config)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None) -> TaskOutput:
        """start_positions, end_positions: (B,) token indices of the answer span (0 when there is none).
        logits (B, T, 2): start scores in [..., 0], end scores in [..., 1]."""
        out = self.encoder.encode(input_ids, attention_mask)
        logits = self.classifier(self.dropout(self.head(out.padded())))  # (B, T, 2)
        return TaskOutput(span_loss(logits, start_positions, end_positions), logits)


def first_real_token(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) mask -> (B, T) bool, True at each row's first real token."""
    first = torch.zeros_like(attention_mask, dtype=torch.bool)
    first[torch.arange(first.shape[0], device=first.device), attention_mask.ne(0).int().argmax(-1)] = True
    return first


def pool(config: ModernBertConfig, out: Encoded, attention_mask: torch.Tensor | None,
         first_real: bool = False) -> torch.Tensor:
    """One vector per row (B, H) by `config.classifier_pooling`: "cls" reads position 0 (with `first_real`, each
    row's first real token, as transformers' multiple-choice model does), "mean" averages the real tokens
    (transformers' formula)."""
    if config.classifier_pooling == "cls":
        if not first_real or attention_mask is None:
            return out.first()  # (B, H)
        # each row's first real token; from the mask's host copy where it has one (no device read)
        first = layout_rules.mark_host(first_real_token(attention_mask), attention_mask, first_real_token)
        return out.select(first)  # (B, H): one selected position per row
    hidden = out.padded()  # (B, T, H), zeros at padding when unpadded
    mask = torch.ones(hidden.shape[:2], dtype=hidden.dtype, device=hidden.device) if attention_mask is None \
        else attention_mask.ne(0).to(hidden.dtype)
    return (hidden * mask.unsqueeze(-1)).sum(dim=1) / mask.sum(dim=1, keepdim=True)


def check_inputs(config: ModernBertConfig, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
    """Refuse inputs the model cannot take, with a message that says which tensor and why."""
    check_ids(input_ids)
    if input_ids.shape[1] > config.max_position_embeddings:
        raise ValueError(f"sequence length {input_ids.shape[1]} is longer than max_position_embeddings "
                         f"({config.max_position_embeddings}); truncate the input")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids has "
                         f"{tuple(input_ids.shape)}")
    check_ids_in_vocabulary(input_ids, config.vocab_size)
    if input_ids.numel() and layout_rules.checks_values(input_ids):  # a device sync on GPU; one switch for every model
        if attention_mask is not None and attention_mask.numel() and int(attention_mask.min()) < 0:
            raise ValueError("attention_mask must hold 1 (real token) and 0 (padding), or for packed rows the "
                             "document number 1, 2, ... of each token; it has negative values")
