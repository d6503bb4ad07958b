"""Task models (fine-tuning): a small head on the encoder, as in the BERT paper, section 4.

Sequence classification and regression on the pooled [CLS] vector (RoBERTa and ELECTRA: a dense head of their
own on the first token, `SentenceHead`), token classification on every token, multiple
choice as one [CLS] score per (context, choice), and extractive question answering as a start and an end score per
token. Their parameter names follow transformers' `BertFor...` classes (checkpoint.py renames them per family).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.config import IGNORE_INDEX, BertConfig
from bertkit.models.bert import BertModel, PreTrainedModel, TaskOutput
from bertkit.models.kernels import Linear, activation


class SentenceHead(nn.Module):
    """RoBERTa's and ELECTRA's sequence-classification head, in place of BERT's pooler + linear: the first token's
    vector -> dropout -> dense (H -> H) -> activation (tanh for RoBERTa, gelu for ELECTRA) -> dropout -> out."""

    def __init__(self, config: BertConfig, num_labels: int, act: str) -> None:
        super().__init__()
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.dense = Linear(config.hidden_size, config.hidden_size)
        self.act = torch.tanh if act == "tanh" else activation(act)
        self.out = Linear(config.hidden_size, num_labels)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        """first: (B, H) the last layer at each row's first position -> (B, num_labels)."""
        return self.out(self.dropout(self.act(self.dense(self.dropout(first)))))


class NamedLabels:
    """For models whose head predicts one of `num_labels` named labels (any architecture): the labels and the
    regression switch travel in config.json as transformers writes them (id2label, label2id, problem_type)."""

    labels: list[str]
    regression: bool

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


class _LabelledHead(NamedLabels, PreTrainedModel):
    """Shared by models whose head predicts one of `num_labels` named labels."""

    head_family = "classifier"

    def __init__(self, config: BertConfig, num_labels: int = 2, labels: list[str] | None = None,
                 regression: bool = False, add_pooler: bool = True, sentence_head: bool = False) -> None:
        super().__init__()
        if labels is not None and len(labels) != num_labels:
            raise ValueError(f"{len(labels)} label names for num_labels={num_labels}")
        if regression and num_labels != 1:
            raise ValueError("a regression head has num_labels=1")
        self.config, self.num_labels = config, num_labels
        self.labels = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(num_labels)]
        self.regression = regression
        # A family with a sentence head of its own (RoBERTa, ELECTRA) classifies sequences without the pooler.
        own_head = sentence_head and config.family.classifier_act is not None
        if own_head:
            add_pooler = False
        if add_pooler and not config.family.pooler:
            raise NotImplementedError(f"{type(self).__name__} reads the pooled [CLS] vector, and {config.model_type} "
                                      f"has no pooler; its own classification head is not implemented")
        self.bert = BertModel(config, add_pooler=add_pooler)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = (SentenceHead(config, num_labels, config.family.classifier_act) if own_head
                           else Linear(config.hidden_size, num_labels))


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
    """[CLS] pooled output -> dropout -> linear: classification (cross-entropy) or, with one output, regression.

    A causal model (config.causal, GPT-style) reads the last real token instead (GPT-1's extract token: the input
    is framed start ... [delimiter ...] extract by the tokenizer's specials, and only the last position has seen
    all of it; the first, which BERT pools, sees only itself): dropout -> linear (GPT-1's W_y), or the family's
    own sentence head (RoBERTa's) on that vector. Its output then also carries the last layer as
    `hidden_states[-1]`, for the auxiliary language-modelling loss of fine-tuning (`bertkit.tasks.classify`).
    """

    architecture = "BertForSequenceClassification"

    def __init__(self, config: BertConfig, num_labels: int = 2, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__(config, num_labels, labels, regression or num_labels == 1, sentence_head=True)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """labels: (B,) class ids, or (B,) floats for regression."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        causal = self.config.causal
        if causal:
            vector = last_real_token(out.last_hidden_state, attention_mask)  # (B, H)
            logits = self.classifier(vector if isinstance(self.classifier, SentenceHead) else self.dropout(vector))
        elif isinstance(self.classifier, SentenceHead):
            logits = self.classifier(out.last_hidden_state[:, 0])  # (B, num_labels)
        elif self.config.classifier_pooling == "mean":  # the real tokens' mean, pooler unused
            keep = (torch.ones_like(input_ids) if attention_mask is None else attention_mask.ne(0)).unsqueeze(-1)
            hidden = out.last_hidden_state  # (B, T, H)
            vector = (hidden * keep).sum(1) / keep.sum(1).clamp(min=1)  # (B, H)
            logits = self.classifier(self.dropout(vector))  # (B, num_labels)
        else:
            logits = self.classifier(self.dropout(out.pooler_output))  # (B, num_labels)
        loss = None
        if labels is not None:
            if self.regression:
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX)
        return TaskOutput(loss, logits, (out.last_hidden_state,) if causal else None)

    def language_model_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """GPT-1's language-model head on last-layer vectors (..., H) -> (..., V): the tied input embeddings,
        h W_e^T (no parameter of its own, so the directory is the same with or without the auxiliary loss)."""
        word = self.bert.embeddings.word.weight  # (V, E)
        if word.shape[1] != hidden.shape[-1]:
            raise ValueError(f"the auxiliary LM loss needs embeddings as wide as the hidden states; this model's "
                             f"are factorised ({word.shape[1]} vs {hidden.shape[-1]}): use --lm-weight 0")
        return F.linear(hidden, word)


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
        self.qa = Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None) -> TaskOutput:
        """start_positions, end_positions: (B,) token indices of the answer span (0 when there is none)."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        logits = self.qa(out.last_hidden_state)  # (B, T, 2)
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
