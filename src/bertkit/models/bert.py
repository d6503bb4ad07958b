"""The BERT family's model: embeddings -> encoder layers -> pooler, and the pretraining heads.

Read it top to bottom: small helpers, the embedding block, self-attention, the feed-forward block, one encoder
layer, the pooler and the heads, then the models. Shapes use B = batch, T = sequence length, H = hidden size,
E = embedding width (H unless factorised), A = attention heads, D = H / A (head size), V = vocabulary size.

One implementation serves the whole family; the variants are fields of `BertConfig`, read where they act:

    RoBERTa   padding_offset_positions   Embeddings: positions count from pad_token_id + 1, skipping padding
    ALBERT    embedding_size             Embeddings E wide, then BertModel.project (E -> H); MLM head back to E
              num_hidden_groups          BertModel runs L layers over fewer weight sets (cross-layer sharing)
    ELECTRA   embedding_size             as ALBERT; BertForReplacedTokenDetection + a small BertForMaskedLM
    GPT-style causal                     the attention mask hides later tokens (BertForCausalLM, `generate`)
    DistilBERT type_vocab_size = 0       no token-type embedding

Speed without changing the architecture (each a switch, `set_fast_paths` / `compile_layers`, pinned to the plain
path by tests/test_fastpaths.py):

    unpadding      a batch with padding runs on its real tokens only (`Unpadded`: a flat (N, H) tensor; attention
                   per sequence), so no layer computes on padding; the heads pick the positions they need
    packed rows    an attention mask numbering documents 1, 2, ... keeps attention within each document and
                   restarts its positions, so several short documents share a row without seeing each other
    fused QKV      one (3H, H) projection instead of three (model directories keep transformers' three tensors)
    oneDNN         `linear`: float32 CPU matmuls on oneDNN's kernels, twice MKL's speed where MKL runs its AVX2
                   code on an AVX-512 CPU (forward and backward)
    sparse MLM     `predict_at`: the vocabulary projection only at the masked positions
    compile        `compile_layers`: torch.compile of the encoder layer, with an eager fallback

Inside, modules carry short names of our own (`attn.qkv`, `ffn.up`, ...). On disk a model directory uses
transformers' parameter names of its family; the mapping is a table per family in `bertkit.checkpoint`, so a
checkpoint written here loads in transformers and the other way round.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.checkpoint import save_model
from bertkit.config import IGNORE_INDEX, BertConfig
from bertkit.models.kernels import Linear, activation, linear
from bertkit.models import layouts
from bertkit.models.layouts import (Encoded, Padded, Unpadded, attach_host, attention_bias, exporting, host_copy,
                                    mark_host, positions)
from bertkit.models.modeldir import ModelDir


# ------------------------------------------------------------------------------------------------------------------
# Outputs
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class BertOutput:
    """What `BertModel.forward` returns."""

    last_hidden_state: torch.Tensor  # (B, T, H) output of the last layer
    pooler_output: torch.Tensor | None  # (B, H) tanh(dense([CLS])), None without a pooler
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L+1 tensors (B, T, H): embeddings (projected), every layer
    attentions: tuple[torch.Tensor, ...] | None = None  # L tensors (B, A, T, T): attention probabilities


@dataclass
class PreTrainingOutput:
    """What `BertForPreTraining.forward` returns; losses are None when their labels are not given."""

    loss: torch.Tensor | None  # mlm_loss + nsp_loss (those of them that were computed)
    prediction_logits: torch.Tensor  # (B, T, V) MLM scores
    seq_relationship_logits: torch.Tensor | None  # (B, 2) NSP/SOP scores: 0 = IsNext / in order; None without a head
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class TaskOutput:
    """What a task model (and the LM and discriminator models) returns; `loss` is None without labels."""

    loss: torch.Tensor | None
    logits: torch.Tensor  # (B, num_labels), (B, T, num_labels), (B, num_choices); QA: (B, T, 2) start/end
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None

    @property
    def start_logits(self) -> torch.Tensor:  # question answering
        return self.logits[..., 0]

    @property
    def end_logits(self) -> torch.Tensor:
        return self.logits[..., 1]


def sequence_loss(logits: torch.Tensor, labels: torch.Tensor | None, regression: bool = False) -> torch.Tensor | None:
    """logits (B, C) against labels (B,): cross-entropy over class ids (IGNORE_INDEX skipped; multiple choice: the
    right choice), or for regression mean squared error against (B,) floats; None without labels."""
    if labels is None:
        return None
    if regression:
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX)


def token_loss(logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
    """logits (..., C) against label ids of the leading shape (tagging, masked and causal LMs), IGNORE_INDEX where
    nothing is predicted -> the mean cross-entropy; None without labels."""
    if labels is None:
        return None
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX)


def position_ids(input_ids: torch.Tensor, config: BertConfig,
                 documents: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T) ids -> positions: 0..T-1 (BERT), or RoBERTa's padding-offset positions.

    RoBERTa (fairseq) numbers the real tokens pad_token_id + 1, pad_token_id + 2, ... and gives every padding
    token the position pad_token_id, as transformers' `create_position_ids_from_input_ids` does.
    documents: a packed attention mask (B, T), document numbers 1, 2, ... (0 = padding); positions then restart
    at the first token of every document, so each document is embedded as if it were alone in its row.
    """
    B, T = input_ids.shape
    if documents is not None:
        t = torch.arange(T, device=input_ids.device).expand(B, T)
        starts = torch.ones_like(documents, dtype=torch.bool)
        starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
        pos = t - torch.where(starts, t, 0).cummax(dim=1).values  # (B, T): distance to the document's start
        if not config.padding_offset_positions:
            return pos
        real = documents.ne(0)
        return torch.where(real, pos + config.pad_token_id + 1, config.pad_token_id)
    if not config.padding_offset_positions:
        return torch.arange(T, device=input_ids.device)  # (T,), broadcast over the batch
    real = input_ids.ne(config.pad_token_id).long()  # (B, T)
    return torch.cumsum(real, dim=1) * real + config.pad_token_id


# ------------------------------------------------------------------------------------------------------------------
# Blocks
# ------------------------------------------------------------------------------------------------------------------
class Embeddings(nn.Module):
    """word + position + token-type embeddings, then LayerNorm and dropout; E wide (= H unless factorised)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        E = config.embedding_width
        self.config = config
        self.word = nn.Embedding(config.vocab_size, E)
        self.position = nn.Embedding(config.max_position_embeddings, E)
        # DistilBERT has no segments: type_vocab_size 0 means no table, and token_type_ids are ignored.
        self.token_type = nn.Embedding(config.type_vocab_size, E) if config.type_vocab_size else None
        self.norm = nn.LayerNorm(E, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Ids, token types and positions of the same shape, (B, T) or flat (N,) -> (..., E)."""
        x = self.word(input_ids)
        if self.token_type is not None:
            x = x + self.token_type(token_type_ids)
        x = x + self.position(positions)  # the order transformers sums in, bit for bit
        return self.dropout(self.norm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention with its output projection, residual and LayerNorm (post-LN, as in BERT).

    The query, key and value projections are one (3H, H) weight, `qkv`: one matmul instead of three
    (`fused_qkv`; False runs the three products on its row blocks, the plain path). Model directories keep
    transformers' three tensors: the state-dict hooks below split and join them.
    """

    fused_qkv = True

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        H = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.qkv = Linear(H, 3 * H)  # rows: query, key, value
        self.out = Linear(H, H)
        self.norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.attn_dropout = config.attention_probs_dropout_prob
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.register_state_dict_post_hook(_split_qkv)
        self.register_load_state_dict_pre_hook(_join_qkv)

    def forward(self, x: torch.Tensor, layout: Padded | Unpadded,
                return_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, H) in the padded layout, (N, H) unpadded. Returns the new x and, when asked (padded layout
        only), the (B, A, T, T) attention probabilities."""
        H = x.shape[-1]
        if self.fused_qkv:
            qkv = self.qkv(x)  # (..., 3H)
        else:  # the plain path: three products, on the weight's row blocks
            w, b = self.qkv.weight, self.qkv.bias
            qkv = torch.cat([F.linear(x, w[i * H:(i + 1) * H], b[i * H:(i + 1) * H]) for i in range(3)], dim=-1)
        dropout = self.attn_dropout if self.training else 0.0
        probs = None
        if return_probs:
            context, probs = layout.probabilities(qkv, self.num_heads, dropout, self.training)
        else:
            context = layout.attend(qkv, self.num_heads, dropout)
        return self.norm(x + self.dropout(self.out(context))), probs


_QKV = ("query", "key", "value")


def _split_qkv(module: SelfAttention, state: dict, prefix: str, local_metadata) -> None:
    """state_dict: `qkv.weight/bias` -> transformers' `query`, `key`, `value` tensors (views, no copy)."""
    for kind in ("weight", "bias"):
        fused = state.pop(f"{prefix}qkv.{kind}")
        for name, part in zip(_QKV, fused.chunk(3, dim=0)):
            state[f"{prefix}{name}.{kind}"] = part


def _join_qkv(module: SelfAttention, state: dict, prefix: str, local_metadata, strict, missing_keys,
              unexpected_keys, error_msgs) -> None:
    """load_state_dict: `query`, `key`, `value` tensors -> one `qkv` tensor (those absent stay missing)."""
    for kind in ("weight", "bias"):
        names = [f"{prefix}{name}.{kind}" for name in _QKV]
        if all(n in state for n in names):
            state[f"{prefix}qkv.{kind}"] = torch.cat([state.pop(n) for n in names], dim=0)


class FeedForward(nn.Module):
    """H -> intermediate -> H with the given activation, residual and LayerNorm. `inner_dropout` also drops out
    the activations before `down` (XLNet's block: up -> activation -> dropout -> down -> dropout)."""

    def __init__(self, hidden: int, intermediate: int, act: str, dropout: float, eps: float,
                 inner_dropout: bool = False) -> None:
        super().__init__()
        self.up = Linear(hidden, intermediate)
        self.down = Linear(intermediate, hidden)
        self.act = activation(act)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.inner_dropout = inner_dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = self.act(self.up(x))  # (B, T, intermediate)
        if self.inner_dropout:
            inner = self.dropout(inner)
        return self.norm(x + self.dropout(self.down(inner)))


class Layer(nn.Module):
    """One encoder layer: self-attention block, then feed-forward block."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attn = SelfAttention(config)
        self.ffn = FeedForward(config.hidden_size, config.intermediate_size, config.hidden_act,
                               config.hidden_dropout_prob, config.layer_norm_eps)

    def forward(self, x: torch.Tensor, layout: Padded | Unpadded,
                return_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        x, probs = self.attn(x, layout, return_probs)
        return self.ffn(x), probs


class Pooler(nn.Module):
    """tanh(dense(h_[CLS])): the sentence vector the NSP/SOP head and sequence classifiers read."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        """cls: (B, H) the last layer's vector at each row's first position."""
        return torch.tanh(self.dense(cls))


class MaskedLMHead(nn.Module):
    """dense (H -> E) + activation + LayerNorm, then scores over the vocabulary with the word embeddings (tied).

    With factorised embeddings (ALBERT, ELECTRA's generator) the transform lands in the E-wide embedding space, so
    the decoder can be the E-wide embedding matrix itself.
    """

    onednn: bool | str = "auto"  # the decoder's matmul kernel (`linear`: measured choice; True oneDNN; False plain)

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        E = config.embedding_width
        self.dense = Linear(config.hidden_size, E)
        self.act = activation(config.mlm_head_act)
        self.norm = nn.LayerNorm(E, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.word_embeddings = word_embeddings  # shared module, not a copy: the decoder is tied to it

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.act(self.dense(hidden)))  # (..., E)
        return linear(h, self.word_embeddings.weight, self.bias, self.onednn)  # (..., V)


class TokenDetectionHead(nn.Module):
    """ELECTRA's discriminator head: dense + activation + dense to one score per token (> 0: "replaced")."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.out = Linear(config.hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.dense(hidden))).squeeze(-1)  # (B, T, H) -> (B, T)


def init_module(module: nn.Module, std: float) -> None:
    """BERT's initialisation of one module: normal(0, std) weights of a Linear or Embedding, zero biases,
    LayerNorm weight 1 / bias 0; other modules are left alone."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


# ------------------------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------------------------
class PreTrainedModel(nn.Module):
    """Initialisation and model-directory io shared by every bertkit model."""

    config: BertConfig
    architecture = "BertModel"  # the transformers class name (BERT's; checkpoint.py renames it per family)
    head_family: str | None = None  # which head table of bertkit.checkpoint names this model's head
    encoder_prefix = "bert."  # where the encoder sits in this model's parameter names
    requires_pretrained_heads = False  # refuse a checkpoint without this model's head (instead of starting fresh)

    @classmethod
    def kwargs_from_config(cls, raw: dict) -> dict:
        """Constructor arguments a model directory's config.json implies (e.g. the number of labels)."""
        return {}

    def config_extras(self) -> dict:
        """Keys besides BertConfig's that config.json needs for transformers to build this model."""
        return {}

    def init_weights(self) -> None:
        """BERT initialisation: normal(0, initializer_range) weights, zero biases, LayerNorm weight 1 / bias 0."""
        for module in self.modules():
            init_module(module, self.config.initializer_range)
            if isinstance(module, MaskedLMHead):
                nn.init.zeros_(module.bias)

    def num_parameters(self) -> int:
        """Distinct parameters (tied and shared weights counted once)."""
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def from_pretrained(cls, directory: str | Path, **kwargs):
        """Load a model directory (bertkit's or transformers'): config.json + model.safetensors/pytorch_model.bin,
        through `ModelDir` (`ModelDir.open(directory).load(cls, **kwargs)`: config.json read once)."""
        return ModelDir.open(directory).load(cls, **kwargs)

    def save_pretrained(self, directory: str | Path, tokenizer=None) -> None:
        """Write config.json + model.safetensors (transformers' names), and the tokenizer files when given."""
        save_model(self, directory, tokenizer=tokenizer)


class BertModel(PreTrainedModel):
    """The encoder: token ids -> contextual vectors (and the pooled [CLS] vector)."""

    architecture = "BertModel"
    encoder_prefix = ""
    unpad = True  # run on the real tokens only when a batch has padding (False: the plain padded path)

    def __init__(self, config: BertConfig, add_pooler: bool = True) -> None:
        """add_pooler: build the pooler (families without one, ELECTRA and DistilBERT, never have it)."""
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        # Factorised embeddings: E-wide vectors enter the layers through one learned E -> H map.
        self.project = Linear(config.embedding_size, config.hidden_size) if config.embedding_size else None
        # With sharing (ALBERT) there are fewer weight sets than layers; forward applies them in turn.
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_layer_weights))
        self.pooler = Pooler(config) if add_pooler and config.family.pooler else None
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> BertOutput:
        """input_ids, token_type_ids: (B, T) integer tensors; attention_mask (B, T): 1 = real token, 0 = padding,
        or, for packed rows, the document number 1, 2, ... of each token (attention stays within a document and
        positions restart at each document's first token).

        With the unpadded layout (the default) `last_hidden_state` and `hidden_states` are 0 at padding positions;
        the real positions are what transformers computes.
        """
        out = self.encode(input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        pooled = self.pooler(out.first()) if self.pooler is not None else None
        return BertOutput(out.padded(), pooled, out.hidden_states, out.attentions)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False,
               output_attentions: bool = False) -> Encoded:
        """The encoder's output in the layout it ran in (see `Encoded`); `forward` pads it back to (B, T, H).

        The layout: without padding, (B, T, H) and attention without a mask; with padding or packed rows, the
        real tokens only (`Unpadded`) when `self.unpad` (the default), else (B, T, H) with an additive mask, the
        plain path, which `output_attentions` also needs.
        """
        check_inputs(self.config, input_ids, attention_mask, token_type_ids)
        B, T = input_ids.shape
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        packed = full = False
        host = host_copy(attention_mask)
        if attention_mask is not None and attention_mask.numel() and not exporting():
            # From the batch's host copy where the loop attached one (no device read); else a device sync
            low, high = (int(v) for v in (attention_mask if host is None else host).aminmax())
            packed, full = high > 1, low >= 1 and high == 1
        positions = position_ids(input_ids, self.config, attention_mask if packed else None)
        causal = self.config.causal
        tokens = None
        if attention_mask is None or (full and self.unpad and not output_attentions):
            layout: Padded | Unpadded = Padded(None, causal)  # no padding: nothing to mask but the future
            x = self.embeddings(input_ids, token_type_ids, positions)  # (B, T, E)
        elif self.unpad and not output_attentions:
            layout = tokens = Unpadded.build(attention_mask, packed, causal, host)
            x = self.embeddings(tokens.gather(input_ids), tokens.gather(token_type_ids), tokens.gather(positions))
        else:
            layout = Padded(attention_bias(attention_mask, causal, T, self.dtype, input_ids.device, packed))
            x = self.embeddings(input_ids, token_type_ids, positions)
        if self.project is not None:
            x = self.project(x)  # (..., H)
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for i in range(self.config.num_hidden_layers):
            x, probs = self.layers[self.config.layer_weights_index(i)](x, layout, output_attentions)
            if hidden_states is not None:
                hidden_states.append(x)
            if attentions is not None:
                attentions.append(probs)
        if hidden_states is not None and tokens is not None:
            hidden_states = [tokens.pad(h) for h in hidden_states]
        return Encoded(x, tokens, tuple(hidden_states) if hidden_states else None,
                       tuple(attentions) if attentions is not None else None)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype masks are built in: that of the parameters (autocast keeps them float32)."""
        return self.embeddings.word.weight.dtype


class BertForPreTraining(PreTrainedModel):
    """The family's pretraining model: the masked-LM head, plus the sentence-pair head where the family has one.

    BERT: MLM + NSP; ALBERT: MLM + SOP (the same two-way head on the pooled output); RoBERTa, ELECTRA's generator
    and DistilBERT: MLM only (transformers' *ForMaskedLM).
    """

    architecture = "BertForPreTraining"
    head_family = "pretraining"
    requires_pretrained_heads = True
    with_pair_head = True  # BertForMaskedLM turns the pair head off whatever the family

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        pair = config.pair_head and self.with_pair_head
        self.bert = BertModel(config, add_pooler=pair)
        self.mlm = MaskedLMHead(config, self.bert.embeddings.word)
        self.nsp = Linear(config.hidden_size, 2) if pair else None
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False, predict_at: torch.Tensor | None = None) -> PreTrainingOutput:
        """labels: (B, T) original ids at masked positions, IGNORE_INDEX elsewhere; next_sentence_label: (B,).

        predict_at: optional (B, T) bool; the vocabulary projection then runs only at those positions (the masked
        ones, ~15% of tokens) and `prediction_logits` is (N, V) for the N selected positions in row-major order.
        The loss is the same as the dense one when predict_at covers every labelled position.
        """
        if next_sentence_label is not None and self.nsp is None:
            raise ValueError(f"{type(self).__name__} of a {self.config.model_type} model has no sentence-pair head")
        out = self.bert.encode(input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        if predict_at is not None:
            hidden = out.select(predict_at)  # (N, H)
            if labels is not None:
                labels = labels.reshape(-1).index_select(0, positions(predict_at))
        else:
            hidden = out.padded()
        logits = self.mlm(hidden)  # (B, T, V), or (N, V)
        nsp_logits = self.nsp(self.bert.pooler(out.first())) if self.nsp is not None else None  # (B, 2)
        mlm_loss = token_loss(logits, labels)
        nsp_loss = None if next_sentence_label is None else sequence_loss(nsp_logits, next_sentence_label.reshape(-1))
        losses = [l for l in (mlm_loss, nsp_loss) if l is not None]
        loss = sum(losses[1:], losses[0]) if losses else None
        return PreTrainingOutput(loss, logits, nsp_logits, mlm_loss, nsp_loss, out.hidden_states, out.attentions)


class BertForMaskedLM(BertForPreTraining):
    """The masked-LM head only, in any family (RoBERTa's model; ELECTRA's generator)."""

    architecture = "BertForMaskedLM"
    head_family = "mlm"
    with_pair_head = False


class BertForCausalLM(BertForMaskedLM):
    """A causal (GPT-style) LM: the same encoder with `config.causal`, the MLM head scoring the next token."""

    architecture = "BertLMHeadModel"

    def __init__(self, config: BertConfig) -> None:
        if not config.causal:
            raise ValueError("BertForCausalLM needs a causal config (causal=True); without it every token sees "
                             "the one it is asked to predict")
        super().__init__(config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """labels: (B, T) the token ids themselves (IGNORE_INDEX to skip); position t is scored on token t + 1."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        logits = self.mlm(out.last_hidden_state)  # (B, T, V): scores for the token after each position
        return TaskOutput(token_loss(logits[:, :-1], None if labels is None else labels[:, 1:]), logits)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, eos_token_id: int | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Continue each row of `input_ids` (B, T0), unpadded, by up to `max_new_tokens` tokens -> (B, T0 + n).

        temperature 0 is greedy (argmax); above 0 samples from softmax(logits / temperature), among the `top_k`
        best when given. Stops early when every row produced `eos_token_id`, or when the positions run out. No
        key/value cache: each step reruns the prefix, which is fine for the quick checks this is for.
        """
        was_training = self.training
        self.eval()
        ids = input_ids
        for _ in range(max_new_tokens):
            if ids.shape[1] >= self.config.max_length:
                break
            logits = self(ids).logits[:, -1].float()  # (B, V) scores for the next token
            if temperature <= 0:
                token = logits.argmax(-1)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                token = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)
            ids = torch.cat([ids, token[:, None]], dim=1)
            if eos_token_id is not None and bool((token == eos_token_id).all()):
                break
        self.train(was_training)
        return ids


class BertForReplacedTokenDetection(PreTrainedModel):
    """ELECTRA's discriminator: for every token, was it replaced? (transformers' ElectraForPreTraining)."""

    architecture = "BertForReplacedTokenDetection"  # ElectraForPreTraining in the electra format
    head_family = "discriminator"
    requires_pretrained_heads = True

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooler=False)
        self.rtd = TokenDetectionHead(config)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_hidden_states: bool = False) -> TaskOutput:
        """labels: (B, T) 1 = replaced, 0 = original. The loss is the mean binary cross-entropy over real tokens."""
        out = self.bert(input_ids, attention_mask, token_type_ids, output_hidden_states)
        logits = self.rtd(out.last_hidden_state)  # (B, T)
        loss = None
        if labels is not None:
            real = torch.ones_like(labels, dtype=torch.bool) if attention_mask is None else attention_mask != 0
            loss = F.binary_cross_entropy_with_logits(logits[real].float(), labels[real].float())
        return TaskOutput(loss, logits, out.hidden_states)


@dataclass
class ElectraOutput:
    """One replaced-token-detection step; the losses are left to `bertkit.training.objectives.ElectraObjective`."""

    mlm_logits: torch.Tensor  # (N, V) generator scores at the N masked positions (row-major)
    mlm_labels: torch.Tensor  # (N,) the original tokens there
    rtd_logits: torch.Tensor  # (B, T) discriminator scores, > 0 = "replaced"
    rtd_labels: torch.Tensor  # (B, T) 1.0 where the discriminator's input differs from the original, else 0.0
    corrupted_ids: torch.Tensor  # (B, T) what the discriminator saw


def generator_config_for(config: BertConfig, fraction: float = 0.25) -> BertConfig:
    """ELECTRA's generator for discriminator `config`: hidden size x fraction (1/4 in the paper for small/base,
    1/3 for large), A = H/64 heads, 4H intermediate, same layers and the same E-wide embeddings."""
    hidden = max(1, round(config.hidden_size * fraction))
    heads = max(1, hidden // 64)
    while hidden % heads:
        heads -= 1
    return dataclasses.replace(config, hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden,
                               embedding_size=config.embedding_width)  # E = H: no projection, set to None


def sample_from_logits(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """(N,) one draw per row of (N, V) `logits` from their softmax, by inversion: row i takes the first token
    whose cumulative probability exceeds uniforms[i] (in [0, 1)). A correct draw for uniform inputs, and a
    function of the inputs alone, so whoever holds the same logits and numbers draws the same tokens (unlike
    torch.multinomial, whose draw depends on its generator's state). The softmax and its running sum are taken in
    float64, so the interval of a token is its probability to about 1e-15 even over a large vocabulary."""
    cdf = logits.double().softmax(-1).cumsum(-1)  # (N, V)
    targets = (uniforms.to(cdf) * cdf[:, -1]).unsqueeze(1)  # scaled by the sum: rounding leaves it a hair off 1
    token = torch.searchsorted(cdf, targets, right=True).squeeze(1)
    return token.clamp_(max=logits.shape[-1] - 1)


class GeneratorDiscriminator(nn.Module):
    """ELECTRA pretraining: a small MLM generator fills the masked positions with samples from its softmax, and the
    discriminator learns to tell, for every token, whether it is the original.

    Both models share one set of embedding tables (word, position, token type and their LayerNorm), as in the
    paper; each keeps its own E -> H projection. `save_pretrained` writes the discriminator as an
    ElectraForPreTraining directory (the model to fine-tune) and the generator as ElectraForMaskedLM in
    `generator/` inside it.
    """

    def __init__(self, config: BertConfig, generator_config: BertConfig | None = None,
                 generator_fraction: float = 0.25) -> None:
        super().__init__()
        generator_config = generator_config or generator_config_for(config, generator_fraction)
        for name in ("vocab_size", "embedding_width", "max_position_embeddings", "type_vocab_size", "pad_token_id",
                     "layer_norm_eps", "hidden_dropout_prob", "model_type"):
            if getattr(config, name) != getattr(generator_config, name):
                raise ValueError(f"generator and discriminator must agree on {name} to share embeddings: "
                                 f"{getattr(generator_config, name)!r} vs {getattr(config, name)!r}")
        self.config, self.generator_config = config, generator_config
        self.discriminator = BertForReplacedTokenDetection(config)
        self.generator = BertForMaskedLM(generator_config)
        shared = self.discriminator.bert.embeddings
        self.generator.bert.embeddings = shared  # one module under two names: one set of parameters
        self.generator.mlm.word_embeddings = shared.word  # the generator's decoder stays tied to the shared table

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                uniforms: torch.Tensor | None = None) -> ElectraOutput:
        """input_ids: (B, T) masked ids; labels: (B, T) original ids at masked positions, IGNORE_INDEX elsewhere.
        uniforms: (B, T) numbers in [0, 1) from which the masked positions' samples are drawn
        (`sample_from_logits`); the trainer passes ones that depend on (seed, step, global row) only
        (`bertkit.data.masking.row_uniforms`), so N ranks replace exactly what 1 rank does. Without them they are
        drawn from torch's global generator."""
        if labels is not None:  # the masked positions, known on the host when the labels came from there
            masked = mark_host(labels != IGNORE_INDEX, labels, lambda x: x != IGNORE_INDEX)
        else:
            masked = attach_host(torch.zeros_like(input_ids, dtype=torch.bool),
                                 torch.zeros(input_ids.shape, dtype=torch.bool))
        at = positions(masked)  # (N,) flat indices: indexing with them reads nothing from the device
        gen = self.generator(input_ids, attention_mask, token_type_ids, predict_at=masked)  # (N, V)
        original = torch.where(masked, labels, input_ids) if labels is not None else input_ids
        corrupted = original.clone()
        if gen.prediction_logits.shape[0]:
            with torch.no_grad():  # sampling is not differentiable: the generator learns from its MLM loss alone
                u = uniforms.reshape(-1).index_select(0, at) if uniforms is not None else torch.rand(
                    gen.prediction_logits.shape[0], dtype=torch.float64, device=input_ids.device)
                corrupted.view(-1).index_copy_(0, at, sample_from_logits(gen.prediction_logits.detach(), u))
        # A sample that happens to equal the original is no replacement: the discriminator must call it original.
        replaced = (corrupted != original).float()
        disc = self.discriminator(corrupted, attention_mask, token_type_ids)
        return ElectraOutput(gen.prediction_logits, original.reshape(-1).index_select(0, at), disc.logits, replaced,
                             corrupted)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save_pretrained(self, directory: str | Path, tokenizer=None) -> None:
        """The discriminator to `directory`, the generator to `directory/generator` (both transformers' format)."""
        self.discriminator.save_pretrained(directory, tokenizer=tokenizer)
        self.generator.save_pretrained(Path(directory) / "generator", tokenizer=tokenizer)

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "GeneratorDiscriminator":
        """Rebuild from `save_pretrained` output (both models, embeddings shared again)."""
        discriminator = BertForReplacedTokenDetection.from_pretrained(directory)
        generator = BertForMaskedLM.from_pretrained(Path(directory) / "generator")
        model = cls(discriminator.config, generator.config)
        model.generator.load_state_dict(generator.state_dict())
        model.discriminator.load_state_dict(discriminator.state_dict())  # last: its tables are the shared ones
        return model


def set_fast_paths(model: nn.Module, unpad: bool | None = None, fused_qkv: bool | None = None,
                   onednn: bool | str | None = None) -> nn.Module:
    """Switch the fast paths of every encoder in `model` (None leaves a switch as it is); returns `model`.

    unpad: run on the real tokens only when a batch has padding or packed rows (`Unpadded`); fused_qkv: one
    query/key/value matmul; onednn: float32 CPU matmuls of the linear layers and the MLM decoder on oneDNN's
    kernels (True), on F.linear (False) or on the kernel measured faster on this machine ("auto", the default;
    `bertkit.models.kernels.linear_choice`). Each computes what the plain path computes (within float rounding); the plain path
    is there to check that, and for `output_attentions`.

    Every architecture is switched alike: a module is switched by the attribute it declares (an encoder's `unpad`,
    an attention's `fused_qkv`, a linear layer's or decoder's `onednn`), not by its class, so ModernBERT's encoder
    and heads follow the same switches as BERT's (an architecture without a switch, such as ModernBERT's fused
    qkv projection, simply has nothing to switch).
    """
    for module in model.modules():
        for name, value in (("unpad", unpad), ("fused_qkv", fused_qkv), ("onednn", onednn)):
            current = getattr(module, name, None)  # the onednn switch may also be "auto" (the measured choice)
            if value is not None and (isinstance(current, bool) or (name == "onednn" and current == "auto")):
                setattr(module, name, value)
    return model


def compile_layers(model: nn.Module, backend: str = "inductor") -> nn.Module:
    """torch.compile every encoder layer of `model` in place (regional compilation: one compiled layer, reused by
    all, compiles in seconds where the whole model takes minutes); returns `model`.

    Shapes are dynamic (the unpadded path sees a new token count every batch). When compilation fails, that layer
    runs eagerly, with a warning, instead of failing the run. Every architecture's encoder layers are compiled:
    the modules in the `layers` list of any encoder (a module with an `unpad` switch: BERT's, ModernBERT's).
    """
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True  # the fallback: eager execution of what cannot be compiled
    for module in model.modules():
        if isinstance(getattr(module, "unpad", None), bool) and isinstance(getattr(module, "layers", None),
                                                                          nn.ModuleList):
            for layer in module.layers:
                layer.compile(dynamic=True, backend=backend)
    return model


def check_inputs(config: BertConfig, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 token_type_ids: torch.Tensor | None) -> None:
    """Refuse inputs the model cannot embed, with a message that says which tensor and why."""
    layouts.check_ids(input_ids)
    T = input_ids.shape[1]
    if T > config.max_length:
        offset = (f", less the {config.pad_token_id + 1} that padding-offset positions skip"
                  if config.padding_offset_positions else "")
        raise ValueError(f"sequence length {T} is longer than max_position_embeddings "
                         f"({config.max_position_embeddings}{offset}); truncate the input (e.g. "
                         f"max_length={config.max_length})")
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and t.shape != input_ids.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but input_ids has {tuple(input_ids.shape)}")
    layouts.check_ids_in_vocabulary(input_ids, config.vocab_size)
    if input_ids.numel() and layouts.checks_values(input_ids):  # a device sync on GPU; a traced graph: no checks
        if token_type_ids is not None and token_type_ids.numel() and config.type_vocab_size:  # 0: ignored
            tt = int(token_type_ids.max())
            if tt >= config.type_vocab_size or int(token_type_ids.min()) < 0:
                raise ValueError(f"token_type_ids contain {tt}, but type_vocab_size is {config.type_vocab_size}")
