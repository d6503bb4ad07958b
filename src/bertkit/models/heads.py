"""Task models (fine-tuning): a small head on the encoder, as in the BERT paper, section 4.

Sequence classification and regression on a sentence vector, token classification on every token, multiple
choice as one sentence score per (context, choice), and extractive question answering as a start and an end score
per token. Their parameter names follow transformers' `BertFor...` classes (checkpoint.py renames them per family).

Which sentence vector, and through which layers, is the family's: transformers gives each family's sequence
classifier and multiple-choice model a head of its own, and `SENTENCE_HEADS` says which one bertkit builds (the
one table of that fact; the matrix in docs/reference/family-matrix.md is checked against it):

    pooler    BERT's pooler, tanh(dense(first token)) -> dropout -> linear       BERT, ALBERT; RoBERTa's choices
    dense     first token -> dropout -> dense -> act -> dropout -> out_proj      RoBERTa (tanh), ELECTRA (gelu)
              (`SentenceHead`: transformers' RobertaClassificationHead, ElectraClassificationHead)
    summary   first token -> dense -> act -> dropout p -> linear                 DistilBERT's pre_classifier (relu,
              (a `summary` Linear, then `classifier`)                            p = seq_classif_dropout 0.2);
                                                                                 ELECTRA's sequence summary for
                                                                                 choices (gelu, p = 0.1)

A causal (GPT-style) model reads the last real token instead of the first (see `last_real_token`), through the same
layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.config import BertConfig
from bertkit.models.bert import BertModel, PreTrainedModel, TaskOutput, sequence_loss, token_loss
from bertkit.models import layouts
from bertkit.models.kernels import Linear, activation


@dataclass(frozen=True)
class HeadSpec:
    """How one family's sequence classifier or multiple-choice model turns the encoder output into scores."""

    style: str  # "pooler", "dense" or "summary" (see the module docstring)
    act: str | None = None  # the dense layer's activation ("dense", "summary")
    # "summary": the dropout after the activation (transformers' default of the family's config key, which
    # bertkit's config does not carry: DistilBERT's seq_classif_dropout, ELECTRA's summary_last_dropout);
    # "dense" uses hidden_dropout_prob as transformers does without classifier_dropout
    dropout: float | None = None


_POOLER = HeadSpec("pooler")
# model_type -> role ("sequence", "choice") -> the head transformers' class of that family has:
# BertFor*, AlbertFor*, RobertaForSequenceClassification (RobertaClassificationHead) / RobertaForMultipleChoice
# (pooler), ElectraForSequenceClassification (ElectraClassificationHead) / ElectraForMultipleChoice
# (ElectraSequenceSummary: summary_type "first", summary_use_proj, summary_activation "gelu",
# summary_last_dropout 0.1), DistilBertForSequenceClassification / DistilBertForMultipleChoice (pre_classifier,
# ReLU, dropout seq_classif_dropout 0.2).
SENTENCE_HEADS: dict[str, dict[str, HeadSpec]] = {
    "bert": {"sequence": _POOLER, "choice": _POOLER},
    "albert": {"sequence": _POOLER, "choice": _POOLER},
    "roberta": {"sequence": HeadSpec("dense", "tanh"), "choice": _POOLER},
    "electra": {"sequence": HeadSpec("dense", "gelu"), "choice": HeadSpec("summary", "gelu", 0.1)},
    "distilbert": {"sequence": HeadSpec("summary", "relu", 0.2), "choice": HeadSpec("summary", "relu", 0.2)},
}


# model_type -> the dropout transformers' question-answering class of that family applies before its outputs
QA_DROPOUT = {"distilbert": 0.1}


def _act(name: str):
    return torch.tanh if name == "tanh" else activation(name)


class SentenceHead(nn.Module):
    """RoBERTa's and ELECTRA's sequence-classification head, in place of BERT's pooler + linear: the first token's
    vector -> dropout -> dense (H -> H) -> activation (tanh for RoBERTa, gelu for ELECTRA) -> dropout -> out."""

    def __init__(self, config: BertConfig, num_labels: int, act: str) -> None:
        super().__init__()
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.dense = Linear(config.hidden_size, config.hidden_size)
        self.act = _act(act)
        self.out = Linear(config.hidden_size, num_labels)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        """first: (B, H) the last layer at each row's first position -> (B, num_labels)."""
        return self.out(self.dropout(self.act(self.dense(self.dropout(first)))))


class NamedLabels:
    """For models whose head predicts one of `num_labels` named labels (any architecture): the labels and the
    regression switch travel in config.json as transformers writes them (id2label, label2id, problem_type)."""

    labels: list[str]
    regression: bool
    named_labels = True  # False: one score per choice (multiple choice), no labels in config.json

    def set_labels(self, config, num_labels: int, labels: list[str] | None, regression: bool) -> None:
        """The config, the label names (LABEL_i by default) and the regression switch; ValueError for names that do
        not fit num_labels, or a regression head of more than one output."""
        if labels is not None and len(labels) != num_labels:
            raise ValueError(f"{len(labels)} label names for num_labels={num_labels}")
        if regression and num_labels != 1:
            raise ValueError("a regression head has num_labels=1")
        self.config, self.num_labels, self.regression = config, num_labels, regression
        self.labels = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(num_labels)]

    @classmethod
    def kwargs_from_config(cls, raw: dict) -> dict:
        id2label = raw.get("id2label")
        if not id2label or not cls.named_labels:
            return {}
        labels = [id2label[str(i)] if str(i) in id2label else id2label[i] for i in range(len(id2label))]
        return {"num_labels": len(labels), "labels": labels, "regression": raw.get("problem_type") == "regression"}

    def config_extras(self) -> dict:
        if not self.named_labels:
            return {}
        extras = {"id2label": {str(i): name for i, name in enumerate(self.labels)},
                  "label2id": {name: i for i, name in enumerate(self.labels)}}
        if self.regression:
            extras["problem_type"] = "regression"
        return extras


class _LabelledHead(NamedLabels, PreTrainedModel):
    """Shared by models whose head predicts one of `num_labels` named labels.

    role: "token" (a linear layer on every token) or "sequence" / "choice" (the family's sentence head,
    `SENTENCE_HEADS`)."""

    head_family = "classifier"

    def __init__(self, config: BertConfig, num_labels: int, labels: list[str] | None, regression: bool,
                 role: str) -> None:
        super().__init__()
        self.set_labels(config, num_labels, labels, regression)
        H = config.hidden_size
        self.spec = SENTENCE_HEADS[config.model_type][role] if role != "token" else None
        style = self.spec.style if self.spec is not None else "token"
        self.bert = BertModel(config, add_pooler=style == "pooler")
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        if style == "dense":
            self.classifier = SentenceHead(config, num_labels, self.spec.act)
        else:
            if style == "summary":
                self.summary = Linear(H, H)
                self.summary_act = _act(self.spec.act)
                self.summary_dropout = nn.Dropout(self.spec.dropout)
            self.classifier = Linear(H, num_labels)

    def sentence_logits(self, out, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The family's sentence head on an encoder output of (B, T) inputs -> (B, num_labels).

        The vector is the pooled first token ("pooler"), the first token's last-layer vector ("dense",
        "summary"), or for a causal model the last real token's (GPT-1's extract token; the pooler, which sees
        only the first token there, is not read)."""
        style = self.spec.style
        if self.config.causal:
            vector = last_real_token(out.last_hidden_state, attention_mask)  # (B, H)
        elif getattr(self.config, "classifier_pooling", "cls") == "mean":  # the real tokens' mean, pooler unused
            hidden = out.last_hidden_state  # (B, T, H)
            keep = (hidden.new_ones(hidden.shape[:2]) if attention_mask is None
                    else attention_mask.ne(0).to(hidden.dtype)).unsqueeze(-1)  # (B, T, 1)
            vector = (hidden * keep).sum(1) / keep.sum(1).clamp(min=1)  # (B, H)
        elif style == "pooler":
            vector = out.pooler_output  # (B, H)
        else:
            vector = out.last_hidden_state[:, 0]  # (B, H)
        if style == "dense":
            return self.classifier(vector)
        if style == "summary":
            return self.classifier(self.summary_dropout(self.summary_act(self.summary(vector))))
        return self.classifier(self.dropout(vector))


def last_real_token(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """hidden (B, T, H), attention_mask (B, T) (nonzero = real token, None = all real) -> (B, H): each row's vector
    at its last real position (with padding on the right, position length - 1): the one position a causal model
    lets see the whole input, GPT-1's extract token."""
    B, T, _ = hidden.shape
    if attention_mask is None:
        return hidden[:, -1]
    positions = torch.arange(1, T + 1, device=hidden.device)  # (T,) 1-based, so a masked-out position scores 0
    last = (attention_mask.ne(0).long() * positions).argmax(-1)  # (B,) the highest real position
    return hidden[torch.arange(B, device=hidden.device), last]


class BertForSequenceClassification(_LabelledHead):
    """The family's sentence head (`SENTENCE_HEADS`; BERT: [CLS] pooled output -> dropout -> linear):
    classification (cross-entropy) or, with one output, regression.

    A causal model (config.causal, GPT-style) reads the last real token instead (GPT-1's extract token: the input
    is framed start ... [delimiter ...] extract by the tokenizer's specials, and only the last position has seen
    all of it; the first, which BERT pools, sees only itself): dropout -> linear (GPT-1's W_y), or the family's
    own sentence head (RoBERTa's) on that vector. Its output then also carries the last layer as
    `hidden_states[-1]`, for the auxiliary language-modelling loss of fine-tuning (`bertkit.tasks.classify`).
    """

    architecture = "BertForSequenceClassification"

    def __init__(self, config: BertConfig, num_labels: int = 2, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__(config, num_labels, labels, regression or num_labels == 1, "sequence")
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """labels: (B,) class ids, or (B,) floats for regression."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        causal = self.config.causal
        logits = self.sentence_logits(out, attention_mask)  # (B, num_labels)
        return TaskOutput(sequence_loss(logits, labels, self.regression), logits,
                          (out.last_hidden_state,) if causal else None)

    def language_model_logits(self, hidden: torch.Tensor, head: nn.Module | None = None) -> torch.Tensor:
        """The language-model head on last-layer vectors (..., H) -> (..., V), always decoding with this model's own
        (tied, trained) input embeddings W_e.

        head: the pretrained causal LM's head (`BertForCausalLM.mlm`: dense, activation, LayerNorm, bias), whose
        transform and bias score tokens as pretraining did: LN(act(h W + b)) W_e^T + bias. None: the bare tied
        embeddings, h W_e^T (GPT-1's head, for a directory without an LM head). Neither adds a parameter to this
        model, so its directory is the same with or without the auxiliary loss."""
        word = self.bert.embeddings.word.weight  # (V, E)
        if head is not None:
            return F.linear(head.norm(head.act(head.dense(hidden))), word, head.bias)
        if word.shape[1] != hidden.shape[-1]:
            raise ValueError(f"the auxiliary LM loss needs embeddings as wide as the hidden states; this model's "
                             f"are factorised ({word.shape[1]} vs {hidden.shape[-1]}): use --lm-weight 0")
        return F.linear(hidden, word)


class BertForTokenClassification(_LabelledHead):
    """Every token's output -> dropout -> linear (NER, tagging); labels on first sub-words, IGNORE_INDEX elsewhere."""

    architecture = "BertForTokenClassification"

    def __init__(self, config: BertConfig, num_labels: int = 2, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__(config, num_labels, labels, False, "token")
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """labels: (B, T) label ids, IGNORE_INDEX where no label applies."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        logits = self.classifier(self.dropout(out.last_hidden_state))  # (B, T, num_labels)
        return TaskOutput(token_loss(logits, labels), logits)


class BertForMultipleChoice(_LabelledHead):
    """One score per (context, choice) pair from the family's sentence head (`SENTENCE_HEADS`; BERT: the pooled
    [CLS]), softmax over the choices (SWAG). A causal model scores each choice at its last real token, as GPT-1
    did for its multiple-choice tasks (the first token sees only itself there)."""

    architecture = "BertForMultipleChoice"
    named_labels = False

    def __init__(self, config: BertConfig, num_labels: int = 1, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__(config, 1, None, False, "choice")
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """input_ids, attention_mask, token_type_ids: (B, C, T) for C choices; labels: (B,) the right choice."""
        B, C, T = input_ids.shape
        mask, types = (None if t is None else layouts.reshape(t, B * C, T) for t in (attention_mask, token_type_ids))
        out = self.bert(input_ids.reshape(B * C, T), mask, types)
        logits = self.sentence_logits(out, mask).view(B, C)  # (B, C)
        return TaskOutput(sequence_loss(logits, labels), logits)


class BertForQuestionAnswering(PreTrainedModel):
    """Extractive QA: a start and an end score for every token (SQuAD); position 0 ([CLS]) means no answer."""

    architecture = "BertForQuestionAnswering"
    head_family = "qa"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooler=False)
        # DistilBertForQuestionAnswering drops out the last layer before its outputs (qa_dropout, 0.1 by default);
        # the other families' classes do not
        p = QA_DROPOUT.get(config.model_type, 0.0)
        self.dropout = nn.Dropout(p) if p else nn.Identity()
        self.qa = Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None) -> TaskOutput:
        """start_positions, end_positions: (B,) token indices of the answer span (0 when there is none)."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        logits = self.qa(self.dropout(out.last_hidden_state))  # (B, T, 2)
        return TaskOutput(span_loss(logits, start_positions, end_positions), logits)


def span_loss(logits: torch.Tensor, start_positions: torch.Tensor | None,
              end_positions: torch.Tensor | None) -> torch.Tensor | None:
    """logits (B, T, 2) start and end scores, positions (B,) -> the mean of the start and end cross-entropies
    (None without positions). Positions outside the window are clamped to T and ignored, as in the reference
    implementation."""
    if start_positions is None or end_positions is None:
        return None
    T = logits.shape[1]
    start, end = start_positions.clamp(0, T), end_positions.clamp(0, T)
    return (F.cross_entropy(logits[..., 0].float(), start, ignore_index=T)
            + F.cross_entropy(logits[..., 1].float(), end, ignore_index=T)) / 2
