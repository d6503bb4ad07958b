"""The BERT model: embeddings -> encoder layers -> pooler, and the pretraining heads.

Read it top to bottom: small helpers, the embedding block, self-attention, the feed-forward block, one encoder
layer, the encoder, the pooler, then the models. Shapes use B = batch, T = sequence length, H = hidden size,
A = attention heads, D = H / A (head size), V = vocabulary size.

Inside, modules carry short names of our own (`attn.query`, `ffn.up`, ...). On disk a model directory uses
transformers' parameter names; the mapping between the two is a table in `bertkit.checkpoint`, so a checkpoint
written here loads in transformers and the other way round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.config import BertConfig

IGNORE_INDEX = -100  # label value that the losses skip (unmasked positions, padding)


# ------------------------------------------------------------------------------------------------------------------
# Outputs
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class BertOutput:
    """What `BertModel.forward` returns."""

    last_hidden_state: torch.Tensor  # (B, T, H) output of the last layer
    pooler_output: torch.Tensor | None  # (B, H) tanh(dense([CLS])), None without a pooler
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L+1 tensors (B, T, H): embeddings, then every layer
    attentions: tuple[torch.Tensor, ...] | None = None  # L tensors (B, A, T, T): attention probabilities


@dataclass
class PreTrainingOutput:
    """What `BertForPreTraining.forward` returns; losses are None when their labels are not given."""

    loss: torch.Tensor | None  # mlm_loss + nsp_loss (those of them that were computed)
    prediction_logits: torch.Tensor  # (B, T, V) MLM scores
    seq_relationship_logits: torch.Tensor  # (B, 2) NSP scores: 0 = IsNext, 1 = NotNext
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


# ------------------------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------------------------
def activation(name: str):
    """The activation function called `name` in transformers' configs."""
    if name == "gelu":
        return F.gelu  # exact, erf-based: what BERT was trained with
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    if name in ("silu", "swish"):
        return F.silu
    raise ValueError(f"unknown activation {name!r}")


def extended_attention_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) 1/0 mask -> (B, 1, 1, T) additive mask: 0 where attended, the dtype's minimum where padded."""
    mask = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - mask) * torch.finfo(dtype).min


# ------------------------------------------------------------------------------------------------------------------
# Blocks
# ------------------------------------------------------------------------------------------------------------------
class Embeddings(nn.Module):
    """word + position + token-type embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        T = input_ids.shape[1]
        positions = torch.arange(T, device=input_ids.device)
        x = self.word(input_ids) + self.token_type(token_type_ids) + self.position(positions)  # (B, T, H)
        return self.dropout(self.norm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention with its output projection, residual and LayerNorm (post-LN, as in BERT)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        H = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.query = nn.Linear(H, H)
        self.key = nn.Linear(H, H)
        self.value = nn.Linear(H, H)
        self.out = nn.Linear(H, H)
        self.norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.attn_dropout = config.attention_probs_dropout_prob
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None,
                return_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, H); mask: (B, 1, 1, T) additive or None. Returns the new x and optionally (B, A, T, T) probs."""
        B, T, H = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, A, T, D)
            return t.view(B, T, self.num_heads, H // self.num_heads).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        dropout = self.attn_dropout if self.training else 0.0
        probs = None
        if return_probs:
            # Spelled out so the probabilities can be returned; SDPA computes the same thing fused.
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, A, T, T)
            if mask is not None:
                scores = scores + mask
            probs = scores.softmax(dim=-1)
            context = F.dropout(probs, dropout, self.training) @ v
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        context = context.transpose(1, 2).reshape(B, T, H)  # (B, A, T, D) -> (B, T, H)
        return self.norm(x + self.dropout(self.out(context))), probs


class FeedForward(nn.Module):
    """H -> intermediate -> H with the configured activation, residual and LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.dropout(self.down(self.act(self.up(x)))))


class Layer(nn.Module):
    """One encoder layer: self-attention block, then feed-forward block."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attn = SelfAttention(config)
        self.ffn = FeedForward(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None,
                return_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        x, probs = self.attn(x, mask, return_probs)
        return self.ffn(x), probs


class Pooler(nn.Module):
    """tanh(dense(h_[CLS])): the sentence vector the NSP head and sequence classifiers read."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class MaskedLMHead(nn.Module):
    """dense + activation + LayerNorm, then scores over the vocabulary with the word-embedding matrix (tied)."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.word_embeddings = word_embeddings  # shared module, not a copy: the decoder is tied to it

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.act(self.dense(hidden)))
        return F.linear(h, self.word_embeddings.weight, self.bias)  # (..., V)


# ------------------------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------------------------
class PreTrainedModel(nn.Module):
    """Initialisation and model-directory io shared by every bertkit model."""

    config: BertConfig
    architecture = "BertModel"  # the transformers class name written to config.json
    head_family: str | None = None  # which table of bertkit.checkpoint.HEAD_KEYS names this model's head
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
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, MaskedLMHead):
                nn.init.zeros_(module.bias)

    def num_parameters(self) -> int:
        """Distinct parameters (the tied decoder counted once)."""
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def from_pretrained(cls, directory: str | Path, **kwargs):
        """Load a model directory (bertkit's or transformers'): config.json + model.safetensors/pytorch_model.bin."""
        from bertkit.checkpoint import load_model

        return load_model(cls, directory, **kwargs)

    def save_pretrained(self, directory: str | Path, tokenizer=None) -> None:
        """Write config.json + model.safetensors (transformers' names), and the tokenizer files when given."""
        from bertkit.checkpoint import save_model

        save_model(self, directory, tokenizer=tokenizer)


class BertModel(PreTrainedModel):
    """The BERT encoder: token ids -> contextual vectors (and the pooled [CLS] vector)."""

    architecture = "BertModel"
    encoder_prefix = ""

    def __init__(self, config: BertConfig, add_pooler: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))
        self.pooler = Pooler(config) if add_pooler else None
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> BertOutput:
        """input_ids, attention_mask (1 = real token, 0 = padding), token_type_ids: (B, T) integer tensors."""
        check_inputs(self.config, input_ids, attention_mask, token_type_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)
        mask = None if attention_mask is None else extended_attention_mask(attention_mask, x.dtype)
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for layer in self.layers:
            x, probs = layer(x, mask, output_attentions)
            if hidden_states is not None:
                hidden_states.append(x)
            if attentions is not None:
                attentions.append(probs)
        pooled = self.pooler(x) if self.pooler is not None else None
        return BertOutput(x, pooled, tuple(hidden_states) if hidden_states else None,
                          tuple(attentions) if attentions is not None else None)


class BertForPreTraining(PreTrainedModel):
    """BERT with the masked-LM head and the next-sentence-prediction head, as the paper pretrains it."""

    architecture = "BertForPreTraining"
    head_family = "pretraining"
    requires_pretrained_heads = True

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.mlm = MaskedLMHead(config, self.bert.embeddings.word)
        self.nsp = nn.Linear(config.hidden_size, 2)
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
        out = self.bert(input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        hidden = out.last_hidden_state
        if predict_at is not None:
            hidden = hidden[predict_at]  # (N, H)
            if labels is not None:
                labels = labels[predict_at]
        logits = self.mlm(hidden)  # (B, T, V), or (N, V)
        nsp_logits = self.nsp(out.pooler_output)  # (B, 2)
        mlm_loss = nsp_loss = None
        if labels is not None:
            mlm_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                       ignore_index=IGNORE_INDEX)
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label.reshape(-1),
                                       ignore_index=IGNORE_INDEX)
        losses = [l for l in (mlm_loss, nsp_loss) if l is not None]
        loss = sum(losses[1:], losses[0]) if losses else None
        return PreTrainingOutput(loss, logits, nsp_logits, mlm_loss, nsp_loss, out.hidden_states, out.attentions)


# ------------------------------------------------------------------------------------------------------------------
# Task models (fine-tuning): a small head on the encoder, as in the BERT paper, section 4
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class TaskOutput:
    """What a task model returns; `loss` is None without labels."""

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


class _LabelledHead(PreTrainedModel):
    """Shared by models whose head predicts one of `num_labels` named labels."""

    head_family = "classifier"

    def __init__(self, config: BertConfig, num_labels: int = 2, labels: list[str] | None = None,
                 regression: bool = False, add_pooler: bool = True) -> None:
        super().__init__()
        if labels is not None and len(labels) != num_labels:
            raise ValueError(f"{len(labels)} label names for num_labels={num_labels}")
        if regression and num_labels != 1:
            raise ValueError("a regression head has num_labels=1")
        self.config, self.num_labels = config, num_labels
        self.labels = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(num_labels)]
        self.regression = regression
        self.bert = BertModel(config, add_pooler=add_pooler)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)

    @classmethod
    def kwargs_from_config(cls, raw: dict) -> dict:
        id2label = raw.get("id2label")
        if not id2label:
            return {}
        labels = [id2label[str(i)] if str(i) in id2label else id2label[i] for i in range(len(id2label))]
        return {"num_labels": len(labels), "labels": labels, "regression": raw.get("problem_type") == "regression"}

    def config_extras(self) -> dict:
        extras = {"id2label": {str(i): name for i, name in enumerate(self.labels)},
                  "label2id": {name: i for i, name in enumerate(self.labels)}}
        if self.regression:
            extras["problem_type"] = "regression"
        return extras


class BertForSequenceClassification(_LabelledHead):
    """[CLS] pooled output -> dropout -> linear: classification (cross-entropy) or, with one output, regression."""

    architecture = "BertForSequenceClassification"

    def __init__(self, config: BertConfig, num_labels: int = 2, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__(config, num_labels, labels, regression or num_labels == 1)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """labels: (B,) class ids, or (B,) floats for regression."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        logits = self.classifier(self.dropout(out.pooler_output))  # (B, num_labels)
        loss = None
        if labels is not None:
            if self.regression:
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX)
        return TaskOutput(loss, logits)


class BertForTokenClassification(_LabelledHead):
    """Every token's output -> dropout -> linear (NER, tagging); labels on first sub-words, IGNORE_INDEX elsewhere."""

    architecture = "BertForTokenClassification"

    def __init__(self, config: BertConfig, num_labels: int = 2, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__(config, num_labels, labels, False, add_pooler=False)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """labels: (B, T) label ids, IGNORE_INDEX where no label applies."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        logits = self.classifier(self.dropout(out.last_hidden_state))  # (B, T, num_labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, self.num_labels).float(), labels.reshape(-1),
                                   ignore_index=IGNORE_INDEX)
        return TaskOutput(loss, logits)


class BertForMultipleChoice(_LabelledHead):
    """One [CLS] score per (context, choice) pair, softmax over the choices (SWAG)."""

    architecture = "BertForMultipleChoice"

    def __init__(self, config: BertConfig, num_labels: int = 1, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__(config, 1, None, False)
        self.init_weights()

    def config_extras(self) -> dict:
        return {}

    @classmethod
    def kwargs_from_config(cls, raw: dict) -> dict:
        return {}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """input_ids, attention_mask, token_type_ids: (B, C, T) for C choices; labels: (B,) the right choice."""
        B, C, T = input_ids.shape
        flat = [None if t is None else t.reshape(B * C, T) for t in (attention_mask, token_type_ids)]
        out = self.bert(input_ids.reshape(B * C, T), *flat)
        logits = self.classifier(self.dropout(out.pooler_output)).view(B, C)  # (B, C)
        loss = None if labels is None else F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX)
        return TaskOutput(loss, logits)


class BertForQuestionAnswering(PreTrainedModel):
    """Extractive QA: a start and an end score for every token (SQuAD); position 0 ([CLS]) means no answer."""

    architecture = "BertForQuestionAnswering"
    head_family = "qa"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooler=False)
        self.qa = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None) -> TaskOutput:
        """start_positions, end_positions: (B,) token indices of the answer span (0 when there is none)."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        logits = self.qa(out.last_hidden_state)  # (B, T, 2)
        loss = None
        if start_positions is not None and end_positions is not None:
            T = logits.shape[1]
            # Positions outside the window are clamped to T and ignored, as in the reference implementation.
            start = start_positions.clamp(0, T)
            end = end_positions.clamp(0, T)
            loss = (F.cross_entropy(logits[..., 0].float(), start, ignore_index=T)
                    + F.cross_entropy(logits[..., 1].float(), end, ignore_index=T)) / 2
        return TaskOutput(loss, logits)


def check_inputs(config: BertConfig, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 token_type_ids: torch.Tensor | None) -> None:
    """Refuse inputs the model cannot embed, with a message that says which tensor and why."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, seq_len), got shape {tuple(input_ids.shape)}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must be an integer tensor, got {input_ids.dtype}")
    T = input_ids.shape[1]
    if T > config.max_position_embeddings:
        raise ValueError(f"sequence length {T} is longer than max_position_embeddings "
                         f"({config.max_position_embeddings}); truncate the input (e.g. max_length={config.max_position_embeddings})")
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and t.shape != input_ids.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but input_ids has {tuple(input_ids.shape)}")
    if input_ids.numel() and not input_ids.is_cuda:  # a device sync on GPU; out-of-range ids fail loudly there anyway
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= config.vocab_size:
            raise ValueError(f"input_ids contain id {high if high >= config.vocab_size else low} outside the "
                             f"vocabulary [0, {config.vocab_size}); does the tokenizer match the model?")
        if token_type_ids is not None and token_type_ids.numel():
            tt = int(token_type_ids.max())
            if tt >= config.type_vocab_size or int(token_type_ids.min()) < 0:
                raise ValueError(f"token_type_ids contain {tt}, but type_vocab_size is {config.type_vocab_size}")
