"""The architecture table: one row per architecture bertkit builds, holding every fact the verbs ask about it.

A row says which config class reads its config.json (and so its size presets, `config_class.PRESETS`), which
model class serves each use ("role"), whether it generates, whether it exports to ONNX (and why not), whether its
tasks run text to text, which task kinds it refuses (and why), and the tokenizer its released checkpoints use.
Beside it, the objective table (OBJECTIVES): one row per pretraining objective, holding its instances, pair task,
trainer task, model role, stream, special tokens and the architectures that take it (an architecture's
`objectives` are read from there). Everything that used to be a table of its own beside the models is derived
from here: `bertkit.models.ROLE_CLASSES` and `class_for`, `OBJECTIVE_MODEL_TYPES` and `check_objective`, the
refused cells of the family x kind matrix (`bertkit.tasks.base.REFUSED`), the model fields `bertkit pretrain
--help` lists and the architectures `bertkit init --model-type` writes.

Adding an architecture is one model file in bertkit/models/, one mapping table in checkpoint.py's FORMATS, one
config class in config.py, one row here, and tests (docs/reference/adding-an-architecture.md walks through it);
adding an objective is one row of OBJECTIVES plus its functions (its trainer task, its instances).

The module imports no torch: model classes are named here (attributes of `bertkit.models`) and imported when a
verb asks for one (`bertkit.models.class_for`), so the task families read the matrix without loading the models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bertkit.config import BertConfig, ElmoConfig, ModernBertConfig, T5Config, XLNetConfig

# How errors name a role (the keys of a row's `roles`): "pretraining" (fill-mask, pretraining; BERT's has the NSP
# head), "mlm" (the masked-LM model alone: MLM distillation), "encoder" (features), the task models "sequence",
# "token", "choice" (SWAG) and "qa", "embedding" (sentence-transformers' pooling) and "seq2seq" (T5's
# encoder-decoder: every task text to text).
ROLE_NAMES = {"pretraining": "pretraining", "mlm": "masked-LM", "encoder": "bare encoder",
              "sequence": "sequence-classification", "token": "token-classification", "choice": "multiple-choice",
              "qa": "question-answering", "embedding": "sentence-embedding",
              "seq2seq": "text-to-text (encoder-decoder)"}


@dataclass(frozen=True)
class Architecture:
    """Everything bertkit knows about one architecture (a transformers model_type, or "causal")."""

    name: str  # the row's key: transformers' model_type, or "causal" (a BERT-family config with causal true)
    config_class: type  # the frozen dataclass that reads and writes its config.json
    roles: dict[str, str]  # role (a ROLE_NAMES key) -> the name of its model class in bertkit.models
    pretraining_role: str = "pretraining"  # the role a fresh model to pretrain is built as (T5: "seq2seq")
    generates: bool = False  # it continues text token by token (serve's "generate" kind)
    text_to_text: bool = False  # its task models are one encoder-decoder emitting the answer as text
    onnx_refusal: str | None = None  # why `bertkit export onnx` refuses it; None: it exports
    refused: dict[str, str] = field(default_factory=dict)  # fine-tuning / predict kind -> why it is refused
    tokenizer: str = "wordpiece"  # the tokenizer kind its released checkpoints use (a hint; every kind loads)
    # How it knows where a token stands: "learned" (a position table with max_position_embeddings rows, grown by
    # `bertkit extend-context`), "rotary" (ModernBERT: the config alone sets the length), "relative" (T5, XLNet:
    # no absolute positions), "none" (ELMo's LSTMs).
    positions: str = "learned"
    config_fields: dict[str, Any] = field(default_factory=dict)  # fields its config holds beyond the preset's
    # Config fields a fresh model takes from its tokenizer beyond pad_token_id: config field -> tokenizer attribute
    # (RoBERTa's bos/eos <s> </s>, ModernBERT's four framing ids, T5's decoder start, ELMo's character alphabet).
    tokenizer_fields: dict[str, str] = field(default_factory=dict)
    # How fill-mask asks its LM: "mask-token" (a masked-LM head reads the mask token), "permutation" (XLNet: the
    # query stream, every mask position hidden from every token).
    mask_prediction: str = "mask-token"
    token_types: bool = True  # its encoder reads token_type_ids (segments); T5's takes none
    marked_by: str = ""  # how config.json says a model is of this row, for messages ("": its model_type)
    named: str = ""  # how messages name it where its config class does not say (the causal row)

    @property
    def label(self) -> str:
        """How messages and the docs name it: its config class's label for its model_type (`bertkit.config.label_of`,
        the one display label of an architecture), or the row's own `named`."""
        return self.named or self.config_class.label_of(self.model_type)

    @property
    def presets(self) -> dict[str, tuple]:
        """The size presets `config_class.preset(name)` knows."""
        return self.config_class.PRESETS

    @property
    def objectives(self) -> tuple[str, ...]:
        """The pretraining objectives (rows of OBJECTIVES) a recipe may pair with it, in the table's order. The
        finer rules (electra needs model_type electra, causal needs causal true, a pair task needs the pair head)
        are the objective row's `requires` and bertkit.training.objectives.build_pretraining's, checked on the config."""
        return tuple(o.name for o in OBJECTIVES.values() if self.name in o.architectures)

    @property
    def implied_by(self) -> str | None:
        """The objective that alone builds this architecture (`--objective t5`), if one does."""
        return next((o.name for o in OBJECTIVES.values() if o.implies == self.name), None)

    @property
    def model_type(self) -> str:
        """transformers' model_type of its config.json ("causal" models are BERT-family ones: "bert")."""
        return "bert" if self.name == "causal" else self.name

    @property
    def marker(self) -> str:
        """How messages say which config.json field makes a model this row's ("model_type xlnet", "is_decoder")."""
        return self.marked_by or f"model_type {self.name}"

    def tokenizer_ids(self, tokenizer: Any) -> dict[str, Any]:
        """The config fields a fresh model of this row takes from `tokenizer`: pad_token_id, and its
        `tokenizer_fields`."""
        return {"pad_token_id": tokenizer.pad_id,
                **{name: getattr(tokenizer, attribute) for name, attribute in self.tokenizer_fields.items()}}


# The task models every BERT-family encoder and ModernBERT has, by role; the BERT family shares one set of classes.
_ENCODER_TASKS = ("sequence", "token", "choice", "qa")
_BERT_ROLES = {"pretraining": "BertForPreTraining", "mlm": "BertForMaskedLM", "encoder": "BertModel",
               **{r: f"BertFor{c}" for r, c in zip(_ENCODER_TASKS, ("SequenceClassification", "TokenClassification",
                                                                     "MultipleChoice", "QuestionAnswering"))},
               "embedding": "SentenceEncoder"}
_T5_TEXT = "T5 is an encoder-decoder, fine-tuned as text to text for glue, classify and squad only; "


_FRAMING = {"bos_token_id": "cls_id", "eos_token_id": "sep_id"}  # RoBERTa's <s> </s>, ALBERT's [CLS] [SEP]


def _bert_row(name: str, tokenizer: str = "wordpiece", **facts: Any) -> Architecture:
    return Architecture(name, BertConfig, _BERT_ROLES, tokenizer=tokenizer, **facts)


# The one architecture table. Its order is the docs' order (the family matrix's rows).
ARCHITECTURES: dict[str, Architecture] = {row.name: row for row in (
    _bert_row("bert"),
    _bert_row("roberta", tokenizer="bpe", tokenizer_fields=_FRAMING),
    _bert_row("albert", tokenizer="unigram", config_fields={"embedding_size": 128},  # the paper's E
              tokenizer_fields=_FRAMING),
    _bert_row("electra"),
    _bert_row("distilbert"),
    # A BERT-family config with causal true (is_decoder in config.json): a GPT-style LM that also fine-tunes.
    Architecture("causal", BertConfig, {**_BERT_ROLES, "pretraining": "BertForCausalLM"},
                 config_fields={"causal": True}, generates=True, tokenizer="bpe", marked_by="is_decoder",
                 named="causal (GPT-style) BERT"),
    Architecture("modernbert", ModernBertConfig,
                 {"pretraining": "ModernBertForMaskedLM", "mlm": "ModernBertForMaskedLM", "encoder": "ModernBertModel",
                  **{r: f"ModernBertFor{c}" for r, c in zip(_ENCODER_TASKS, (
                      "SequenceClassification", "TokenClassification", "MultipleChoice", "QuestionAnswering"))},
                  "embedding": "SentenceEncoder"},
                 tokenizer="bpe", positions="rotary",
                 tokenizer_fields={"cls_token_id": "cls_id", "sep_token_id": "sep_id", **_FRAMING}),
    # T5 has no masked-LM or classifier heads: every task is text to text ("seq2seq": the encoder-decoder).
    Architecture("t5", T5Config, {"encoder": "T5EncoderModel", "seq2seq": "T5ForConditionalGeneration"},
                 pretraining_role="seq2seq", generates=True, text_to_text=True, token_types=False,
                 tokenizer="unigram", positions="relative",
                 # T5 starts the decoder with the padding id
                 tokenizer_fields={"eos_token_id": "sep_id", "decoder_start_token_id": "pad_id"},
                 onnx_refusal="an encoder-decoder generates token by token, which needs an encoder graph and a "
                              "decoder-step graph (with its key/value cache) driven by a loop outside ONNX; serve T5 "
                              "with the torch backend",
                 refused={"ner": _T5_TEXT + "tagging every token needs an encoder with a per-token head (BERT, "
                                            "ModernBERT, XLNet)",
                          "swag": _T5_TEXT + "scoring choices needs an encoder with a per-choice head (BERT, "
                                             "ModernBERT, XLNet)"}),
    # XLNet pretrains by permutation LM ("pretraining": the LM head model); it has no masked-LM model.
    Architecture("xlnet", XLNetConfig,
                 {"pretraining": "XLNetLMHeadModel", "encoder": "XLNetModel",
                  **{r: f"XLNetFor{c}" for r, c in zip(_ENCODER_TASKS, (
                      "SequenceClassification", "TokenClassification", "MultipleChoice", "QuestionAnswering"))}},
                 tokenizer="unigram", positions="relative", mask_prediction="permutation",
                 onnx_refusal="bertkit's XLNet is not traced to ONNX (its forward pass checks input values, which "
                              "torch.export cannot follow, and no exported graph is checked against it); serve XLNet "
                              "with the torch backend"),
    # ELMo: a biLM whose layers are features ("encoder"); its task models are bertkit.features' frozen-encoder
    # models.
    Architecture("elmo", ElmoConfig, {"pretraining": "ElmoLanguageModel", "encoder": "ElmoModel"},
                 tokenizer="word", positions="none",
                 tokenizer_fields={"char_vocab_size": "char_vocab_size", "max_characters": "max_characters"},
                 onnx_refusal="an ELMo task model (character CNN, LSTMs, scalar mix, task LSTM) is served with the "
                              "torch backend; ONNX export covers the BERT family and ModernBERT",
                 refused={"swag": "ELMo's layers feed frozen-feature task models for sequences, tokens and answer "
                                  "spans (--frozen); bertkit has no multiple-choice model on them"}),
)}



@dataclass(frozen=True)
class Objective:
    """Everything bertkit knows about one pretraining objective. The classes and factories are named, not imported
    (this floor imports no training code): `task_class` is a class of bertkit.training.objectives, `model` one of
    bertkit.models, `stream` and `build` keys of bertkit.training.pretrain's STREAMS and BUILDERS; the layer that owns each
    resolves it."""

    name: str  # the row's key: DataConfig.objective, `--objective`
    label: str  # what it trains, for messages and `bertkit pretrain --help`
    instances: str  # the instance kind of bertkit.data.loader (OBJECTIVE_INSTANCES), or "words" (ELMo's windows)
    pair_task: str | None  # the sentence-pair task trained beside it ("nsp", "sop"), or None
    task_class: str  # its trainer task: a class of bertkit.training.objectives (built by its `for_recipe`)
    architectures: tuple[str, ...]  # the ARCHITECTURES rows that pretrain with it
    special_tokens: tuple[str, ...]  # the tokenizer's special tokens its batches need (cls, sep, pad, mask, sentinels)
    model_role: str = "pretraining"  # the architecture's role (a ROLE_NAMES key) it trains (T5: "seq2seq")
    model: str | None = None  # a class of bertkit.models trained instead of the role's (ELECTRA's pair of models)
    model_settings: tuple[str, ...] = ()  # the recipe's data fields `model` takes as keywords
    stream: str = "instances"  # the stream factory: masked instances, or "word-windows" (bertkit.data.lmstream)
    build: str = "encoder"  # how the model's config is made from the recipe and the tokenizer: encoder, t5, elmo
    implies: str | None = None  # the architecture it alone builds (`--objective t5` is a T5)
    # (config field, value, why): a rule on the model's config beyond its architecture's row
    requires: tuple[str, Any, str] | None = None

    @property
    def masked_lm(self) -> bool:
        """Whether its batches are masked-LM ones a masked-LM teacher can score (MLM distillation reads them)."""
        return self.task_class == "MaskedLMObjective"


_BERT_FAMILY = ("bert", "roberta", "albert", "electra", "distilbert")
_MASKED = ("cls", "sep", "pad", "mask")


def _mlm(name: str, label: str, instances: str, pair_task: str | None, architectures: tuple[str, ...]) -> Objective:
    return Objective(name, label, instances, pair_task, "MaskedLMObjective", architectures, _MASKED)


# The one objective table: adding an objective is one row here plus its functions (its trainer task in
# bertkit.training.objectives, its instances in bertkit.data); pretrain, distill and the tests read it.
OBJECTIVES: dict[str, Objective] = {row.name: row for row in (
    _mlm("bert", "MLM + NSP", "nsp", "nsp", _BERT_FAMILY),
    _mlm("albert", "MLM + SOP", "sop", "sop", _BERT_FAMILY),
    _mlm("roberta", "MLM, FULL-SENTENCES", "full-sentences", None, (*_BERT_FAMILY, "modernbert")),
    _mlm("roberta-doc", "MLM, DOC-SENTENCES", "doc-sentences", None, (*_BERT_FAMILY, "modernbert")),
    # RoBERTa's two NSP formats (Liu et al., 2019, table 2), on a BERT model (an NSP head): segment pairs are BERT's
    # own instances; sentence pairs hold one natural sentence each.
    _mlm("roberta-segment-pair", "MLM + NSP on segment pairs", "nsp", "nsp", _BERT_FAMILY),
    _mlm("roberta-sentence-pair", "MLM + NSP on single-sentence pairs", "sentence-pair", "nsp", _BERT_FAMILY),
    Objective("electra", "replaced-token detection", "full-sentences", None, "ElectraObjective", _BERT_FAMILY,
              _MASKED, model="GeneratorDiscriminator", model_settings=("generator_fraction",),
              requires=("model_type", "electra", "the electra objective saves an ElectraForPreTraining "
                                                 "discriminator: set the model's model_type to electra")),
    # Next-token LM on the masked stream's batches, masking undone (CausalLMObjective)
    Objective("causal", "next-token LM", "full-sentences", None, "CausalLMObjective", (*_BERT_FAMILY, "causal"),
              _MASKED, model="BertForCausalLM",
              requires=("causal", True, "the causal objective needs a causal model: set the model's causal to true")),
    Objective("t5", "T5's span corruption", "spans", None, "SpanCorruptionObjective", ("t5",),
              ("sep", "pad", "sentinels"), model_role="seq2seq", build="t5", implies="t5"),
    Objective("xlnet", "permutation LM with memory", "xlnet", None, "PermutationLMObjective", ("xlnet",),
              ("cls", "sep", "pad"), implies="xlnet"),
    Objective("elmo", "bidirectional LM on words and their characters", "words", None, "BiLMObjective", ("elmo",),
              ("cls", "sep", "pad"), stream="word-windows", build="elmo", implies="elmo"),
)}

# Objectives that imply an architecture: `--objective t5` alone builds a T5 (the recipe's model_type may say so too).
OBJECTIVE_MODEL_TYPES: dict[str, str] = {row.name: row.implies for row in OBJECTIVES.values()
                                         if row.implies is not None}


def objective(name: str) -> Objective:
    """The row of an objective; ValueError naming the known ones otherwise."""
    row = OBJECTIVES.get(name)
    if row is None:
        raise ValueError(f"unknown objective {name!r}; choose one of {', '.join(OBJECTIVES)}")
    return row


def architecture(name: str | None) -> Architecture:
    """The row of a model_type (None: BERT's) or "causal"; ValueError naming the known ones otherwise."""
    row = ARCHITECTURES.get(name or "bert")
    if row is None:
        raise ValueError(f"unknown model_type {name!r}; bertkit builds {', '.join(ARCHITECTURES)}")
    return row


def architecture_of(config: Any) -> Architecture:
    """The row of a config object (any config class): its model_type's, "causal" for a causal BERT-family one."""
    return ARCHITECTURES["causal" if getattr(config, "causal", False) else config.model_type]


def config_classes() -> list[type]:
    """Every config class, once each, in the table's order (BertConfig first)."""
    return list(dict.fromkeys(row.config_class for row in ARCHITECTURES.values()))


def refused_cells() -> dict[tuple[str, str], str]:
    """(architecture, kind) -> why that verb is refused, for every refused cell of the family x kind matrix."""
    cells = {}
    for row in ARCHITECTURES.values():
        cells.update({(row.name, kind): reason for kind, reason in row.refused.items()})
        if row.onnx_refusal is not None:
            cells[row.name, "export"] = row.onnx_refusal
    return cells
