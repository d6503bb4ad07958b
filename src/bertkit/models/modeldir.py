"""One model directory, read once: `ModelDir.open(path)` is what every verb asks "what does this directory hold,
and how do I load it for this use?".

A model directory is config.json + weights + tokenizer files (a released ELMo may instead be bilm-tf's
options.json + weights.hdf5, read by `read_config` here), and after fine-tuning also:

    finetune.json      the fine-tuning record: the kind, the GLUE task, lengths, columns (`bertkit.tasks.run`)
    task_model.json    a task model on the encoder's layers (`bertkit.features.FeatureTaskModel`: frozen features,
                       ELMo, `--task-model bilstm`), with task_model.safetensors beside it

`open` reads those files once (each bad or missing one is a one-line error naming the directory and the file);
the directory then answers what it holds (architecture, config, positions, the fine-tuning record, the head its
weights hold, which loader reads it, whether it generates, its tokenizer) and loads it for a role of the
architecture table or a use ("fill-mask", "embeddings", "generate"): `load`, the one loading ladder.

The task kinds (classify, ner, ...) are the task families' (`bertkit.tasks`, a floor up): a family names the
role of its task model (`TaskFamily.model_role`), and the directory loads that role. Likewise the frozen-feature
task model lives in `bertkit.features` (a floor up, with its scalar mix and BiLSTM): the directory only reports
that it holds one (`form == "feature-task"`, `task_model` its settings) and `FeatureTaskModel.from_pretrained`
does the loading, so no import ever points up from here.

ModelDir is the one road into a model: every `from_pretrained` of bertkit's models goes through it, and config.json
is parsed once per load (here; `bertkit.checkpoint.load_model` takes the parsed config). What the drivers call:

    model_dir = ModelDir.open(path)                  # config.json, finetune.json, task_model.json, read once
    model_dir.load("sequence")                       # a role of the architecture's registry row, or a use of USES
    model_dir.load("pretraining", new_heads=True)    # fresh heads on an encoder (pretraining from a checkpoint)
    model_dir.load(BertForMaskedLM)                  # a model class (checked against the directory's config class)
    model_dir.load("encoder", add_pooler=False)      # keywords go to the model's constructor
    model_dir.model_class("generate")                # the class without loading it
    model_dir.row                                    # its row of the architecture table (generates, positions, ...)
    model_dir.tokenizer()                            # any kind; ELMo's words with open vocabulary

The causal (GPT-style) model is a row of the table like any other ("causal": a BERT-family config with causal
true), so a causal directory's "pretraining" and "generate" are BertForCausalLM by the same lookup as every role.

The module imports no torch (the task families read USES and `architecture_role` without loading the models).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit.config import CONFIG_NAME, ElmoConfig, config_from_dict
from bertkit.errors import CheckpointError
from bertkit.io import read_json_object
from bertkit.models import class_for
from bertkit.models.registry import Architecture, architecture_of
from bertkit.tokenizers import load_tokenizer
from bertkit.tokenizers.word import BILM_OPTIONS, BILM_VOCAB, apply_words, is_bilm_directory, read_bilm_vocab

TASK_FILE = "finetune.json"  # the fine-tuning record of a fine-tuned model directory
TASK_MODEL_FILE = "task_model.json"  # a task model on the encoder's layers (bertkit.features)

# The head a config.json architecture names, by its suffix in any family's spelling (BertForTokenClassification,
# RobertaForTokenClassification, ...; XLNet's span model is transformers' XLNetForQuestionAnsweringSimple) -> the
# role that loads it (a key of its registry row's roles; "causal": BertForCausalLM, the causal row's "pretraining").
HEAD_SUFFIXES = (("ForSequenceClassification", "sequence"), ("ForTokenClassification", "token"),
                 ("ForQuestionAnswering", "qa"), ("ForMultipleChoice", "choice"), ("ForPreTraining", "pretraining"),
                 ("ForMaskedLM", "mlm"), ("ForCausalLM", "causal"), ("ForConditionalGeneration", "seq2seq"))
# The roles of task models (a sequence, each token, each choice, a span; every task as text to text).
TASK_ROLES = ("sequence", "token", "choice", "qa", "seq2seq")


@dataclass(frozen=True)
class Use:
    """A use of a directory without a task head (a task kind's facts are its family's, `bertkit.tasks`)."""

    role: str  # the role that serves it ("generate": the seq2seq or the causal model, whichever the directory holds)
    served: bool  # offered by `bertkit serve` and `bertkit export` (bertkit.tasks.base.SERVED_KINDS)
    input_fields: tuple[tuple[str, ...], tuple[str, ...]] = (("text",), ())  # a served input's (required, optional)


# The one list of the uses: the served ones are SERVED_USES, and `bertkit features` reads the encoder.
USES = {"fill-mask": Use("pretraining", True), "embeddings": Use("encoder", True), "generate": Use("generate", True),
        "features": Use("encoder", False)}
SERVED_USES = tuple(name for name, use in USES.items() if use.served)


def _role(role_or_use: str) -> str:
    """The role of a use of USES, or `role_or_use` itself when it is a role."""
    use = USES.get(role_or_use)
    return use.role if use is not None else role_or_use


def architecture_role(name: str) -> str | None:
    """The role of the head a config.json architecture names, by its suffix in any family's spelling
    ("RobertaForTokenClassification" -> "token"); None for a bare model ("BertModel"). The one suffix matcher: the
    task families match their architectures through it (`bertkit.tasks.base.TaskFamily.matches_architecture`)."""
    name = name.removesuffix("Simple")
    return next((role for suffix, role in HEAD_SUFFIXES if name.endswith(suffix)), None)


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, None when absent; ValueError naming the file when it is not one."""
    return read_json_object(path) if path.is_file() else None


@dataclass(frozen=True)
class ModelDir:
    """A model directory's files, read once; see the module docstring."""

    path: Path
    raw: dict[str, Any]  # config.json as read (a released ELMo's options.json as its config)
    config: Any  # the config dataclass of its architecture (BertConfig, ModernBertConfig, T5Config, ...)
    info: dict[str, Any] = field(default_factory=dict)  # finetune.json ({} without one)
    task_model: dict[str, Any] | None = None  # task_model.json (None without one)

    @classmethod
    def open(cls, path: "str | os.PathLike | ModelDir") -> "ModelDir":
        """Read `path`'s config.json (or bilm-tf's options.json), finetune.json and task_model.json (a ModelDir
        is returned as it is, so that a function may take either).

        FileNotFoundError "{path}: no config.json; not a model directory" without a config; ValueError (a
        CheckpointError for config.json) naming the file that is not valid JSON or has a bad field.
        """
        if isinstance(path, ModelDir):
            return path
        path = Path(path)
        if not ((path / CONFIG_NAME).is_file() or is_bilm_directory(path)):
            raise FileNotFoundError(f"{path}: no {CONFIG_NAME}; not a model directory")
        raw = read_config(path)
        config = config_from_dict(raw, source=str(path / CONFIG_NAME))
        return cls(path, raw, config, _read_json(path / TASK_FILE) or {}, _read_json(path / TASK_MODEL_FILE))

    # ---- what it holds ---------------------------------------------------------------------------------------
    def __str__(self) -> str:
        return str(self.path)

    @property
    def model_type(self) -> str:
        return self.config.model_type

    @property
    def row(self) -> Architecture:
        """Its row of the architecture table (`bertkit.models.registry`; "causal" for a causal BERT-family one)."""
        return architecture_of(self.config)

    @property
    def architectures(self) -> list[str]:
        return list(self.raw.get("architectures") or [])

    @property
    def max_positions(self) -> int:
        """The longest input the model takes (its usable position embeddings; unbounded for ELMo)."""
        return getattr(self.config, "max_length", sys.maxsize)

    @property
    def trained_kind(self) -> str | None:
        """The kind it was fine-tuned for (finetune.json), None for a directory not fine-tuned by bertkit."""
        return self.info.get("kind")

    @property
    def head_role(self) -> str | None:
        """The role of the head its weights hold, from config.json's architectures (None: a bare encoder)."""
        return next((role for role in map(architecture_role, self.architectures) if role is not None), None)

    def has_role(self, role: str) -> bool:
        """Whether bertkit has a `role` model for this architecture (a key of its registry row's roles)."""
        return role in self.row.roles

    @property
    def has_task_heads(self) -> bool:
        """Whether the architecture has task models of its own (ELMo has none: its layers feed the task models of
        `bertkit.features`)."""
        return any(self.has_role(role) for role in TASK_ROLES)

    @property
    def text_to_text(self) -> bool:
        """Whether its tasks run text to text (an encoder-decoder: T5; its row's `text_to_text`)."""
        return self.row.text_to_text

    @property
    def causal(self) -> bool:
        """Whether it is a causal (GPT-style) language model: it generates and its tasks are not text to text."""
        return self.row.generates and not self.row.text_to_text

    @property
    def generates(self) -> bool:
        """Whether it writes text token by token (an encoder-decoder, or a causal language model: its row's
        `generates`)."""
        return self.row.generates

    @property
    def form(self) -> str:
        """Which loader reads it for prediction: "feature-task" (task_model.json: `bertkit.features`),
        "text-to-text" (an encoder-decoder: `bertkit.tasks.text2text`), else "head" (a task head of its own)."""
        if self.task_model is not None:
            return "feature-task"
        return "text-to-text" if self.text_to_text else "head"

    # ---- loading ---------------------------------------------------------------------------------------------
    def tokenizer(self, who: str = "model", words: str | None = None):
        """Its tokenizer, of whatever kind (`bertkit.tokenizers.load_tokenizer`); ELMo reads words by their
        characters, so its word tokenizer keeps unknown words' spelling (open vocabulary). `words` ("whitespace" or
        "bert", ELMo only) changes how its text splits into words (None: as its files say: whitespace for a released
        ELMo, BERT's pre-tokenizer for bertkit's own). FileNotFoundError saying the `who` (model, teacher) must be a
        model directory with its tokenizer files; ValueError for `words` on another kind of tokenizer."""
        try:
            tokenizer = load_tokenizer(self.path)
        except FileNotFoundError as err:
            raise FileNotFoundError(f"{err}; the {who} must be a model directory with its tokenizer files") from None
        if getattr(tokenizer, "kind", None) == "word" and self.row.tokenizer == "word":
            tokenizer.open_vocabulary = True  # an architecture that reads words by their characters (ELMo)
        return apply_words(tokenizer, words)

    def model_class(self, role: str, kind: str = "") -> type:
        """The class that loads this directory for `role` (a key of its registry row's roles, or a use of USES:
        "generate" is the model a generating architecture pretrains as, BertForCausalLM or T5's encoder-decoder).
        ValueError naming the model type and the role (and the `kind` asked for, when given) where the
        architecture has none."""
        role = _role(role)
        if role == "generate":
            if not self.generates:
                raise ValueError(f"{self.path}: not a causal model (config.json has no is_decoder: true); generation "
                                 f"needs one pretrained with --objective causal, or an encoder-decoder (T5)")
            role = self.row.pretraining_role
        try:
            return class_for(self.config, role, str(self.path))
        except ValueError as err:
            raise ValueError(f"{kind}: {err}" if kind else str(err)) from None

    def load(self, role: "str | type", new_heads: bool = False, **kwargs: Any):
        """The model for `role` (see `model_class`; or a model class, which must read this directory's config
        class), strictly loaded from the directory with the config read by `open` (`bertkit.checkpoint.load_model`).

        new_heads: start the role's heads fresh (pretraining from an encoder; another number of labels); without
        it a task model on a directory without its head starts that head fresh, and a pretraining model refuses a
        bare encoder (HeadMismatchError). kwargs go to the model's constructor (`add_pooler`, dropout, ...). The bare
        encoder ("encoder", "embeddings", "features") of a token-classification or QA directory, which has no
        pooler, is loaded without one.
        """
        # checkpoint loads torch: imported here so that this module (read by the task families) stays torch-free
        from bertkit.checkpoint import WeightsMismatchError, load_model

        cls = role if isinstance(role, type) else self.model_class(role)
        try:
            return load_model(cls, self.path, self.raw, self.config, new_heads=new_heads, **kwargs)
        except WeightsMismatchError as err:
            if isinstance(role, type) or _role(role) != "encoder" or "add_pooler" in kwargs or not any(
                    name.startswith("pooler.") for name in err.missing):
                raise
            return load_model(cls, self.path, self.raw, self.config, new_heads=new_heads, add_pooler=False, **kwargs)


def model_class(directory: str | os.PathLike, role: str) -> type:
    """`ModelDir.open(directory).model_class(role)`: the class that loads `directory` for `role`."""
    return ModelDir.open(directory).model_class(role)


# ------------------------------------------------------------------------------------------------------------------
# config.json, or a released ELMo's options.json: the one reader of a model directory's config
# ------------------------------------------------------------------------------------------------------------------
def read_config(directory: str | os.PathLike) -> dict[str, Any]:
    """config.json of a model directory as a dict (a released ELMo's options.json in config.json's fields);
    CheckpointError naming the file when it is not a JSON object."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file() and is_bilm_directory(directory):
        return bilm_config(directory)
    return read_json_object(path, "config file", CheckpointError)


def _options_field(options: dict, path: str, source: Path, kind: type | tuple = int) -> Any:
    value: Any = options
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise CheckpointError(f"{source}: no {path}")
        value = value[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise CheckpointError(f"{source}: {path} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def bilm_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The ElmoConfig dict (config.json's fields) of a released ELMo: its options.json in bertkit's names.

    bilm-tf's fields: char_cnn {filters, n_highway, embedding.dim, max_characters_per_token, n_characters,
    activation (relu only: the char CNN here is relu's)}, lstm {projection_dim, dim, n_layers, cell_clip, proj_clip,
    use_skip_connections}. vocab_size is the word list's (vocab.txt beside it; the softmax is not in the weights).
    CheckpointError naming options.json and the field otherwise."""
    path = Path(directory) / BILM_OPTIONS
    options = read_json_object(path, "bilm-tf options file", CheckpointError)
    activation = _options_field(options, "char_cnn.activation", path, str)
    if activation != "relu":
        raise CheckpointError(f"{path}: char_cnn.activation {activation!r} is not supported (bertkit's ELMo "
                              f"character CNN is relu's, as the released models)")
    clips = {}
    for name in ("cell_clip", "proj_clip"):
        value = options["lstm"].get(name) if isinstance(options.get("lstm"), dict) else None
        clips[name] = None if value in (None, 0) else _options_field(options, f"lstm.{name}", path, (int, float))
    raw = {"model_type": "elmo",
           "vocab_size": len(read_bilm_vocab(Path(directory) / BILM_VOCAB)),
           "char_vocab_size": _options_field(options, "char_cnn.n_characters", path),
           "max_characters": _options_field(options, "char_cnn.max_characters_per_token", path),
           "char_embedding_dim": _options_field(options, "char_cnn.embedding.dim", path),
           "filters": _options_field(options, "char_cnn.filters", path, list),
           "num_highway": options["char_cnn"].get("n_highway") or 0,
           "projection_dim": _options_field(options, "lstm.projection_dim", path),
           "lstm_dim": _options_field(options, "lstm.dim", path),
           "num_layers": _options_field(options, "lstm.n_layers", path),
           "residual": _options_field(options, "lstm.use_skip_connections", path, bool),
           **clips}
    try:
        ElmoConfig.from_dict(raw, source=str(path))
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    return raw
