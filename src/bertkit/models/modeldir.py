"""One model directory, read once: `ModelDir.open(path)` is what every verb asks "what does this directory hold,
and how do I load it for this use?".

A model directory is config.json + weights + tokenizer files (a released ELMo may instead be bilm-tf's
options.json + weights.hdf5, read through `bertkit.checkpoint.read_config`), and after fine-tuning also:

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
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit.io import read_json_object

TASK_FILE = "finetune.json"  # the fine-tuning record of a fine-tuned model directory
TASK_MODEL_FILE = "task_model.json"  # a task model on the encoder's layers (bertkit.features)

# The head a config.json architecture names, by its suffix in any family's spelling (BertForTokenClassification,
# RobertaForTokenClassification, ...; XLNet's span model is transformers' XLNetForQuestionAnsweringSimple) -> the
# role of `bertkit.models.ROLE_CLASSES` that loads it ("causal": BertForCausalLM, which the role table lacks).
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
        from bertkit.checkpoint import CONFIG_NAME, config_from_dict, read_config
        from bertkit.tokenizers.word import is_bilm_directory

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
        """Whether bertkit has a `role` model for this architecture (a key of its ROLE_CLASSES row)."""
        from bertkit.models import ROLE_CLASSES

        return role in ROLE_CLASSES.get(type(self.config), {})

    @property
    def has_task_heads(self) -> bool:
        """Whether the architecture has task models of its own (ELMo has none: its layers feed the task models of
        `bertkit.features`)."""
        return any(self.has_role(role) for role in TASK_ROLES)

    @property
    def text_to_text(self) -> bool:
        """Whether its tasks run text to text (an encoder-decoder: T5)."""
        return self.has_role("seq2seq")

    @property
    def causal(self) -> bool:
        """Whether it is a causal (GPT-style) language model."""
        return bool(getattr(self.config, "causal", False))

    @property
    def generates(self) -> bool:
        """Whether it writes text token by token (an encoder-decoder, or a causal language model)."""
        return self.text_to_text or self.causal

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
        from bertkit.tokenizers import load_tokenizer
        from bertkit.tokenizers.word import apply_words

        try:
            tokenizer = load_tokenizer(self.path)
        except FileNotFoundError as err:
            raise FileNotFoundError(f"{err}; the {who} must be a model directory with its tokenizer files") from None
        if getattr(tokenizer, "kind", None) == "word" and self.model_type == "elmo":
            tokenizer.open_vocabulary = True
        return apply_words(tokenizer, words)

    def model_class(self, role: str, kind: str = "") -> type:
        """The class that loads this directory for `role` (a key of ROLE_CLASSES' rows, "causal", or a use of
        USES). ValueError naming the model type and the role (and the `kind` asked for, when given)
        where the architecture has none."""
        from bertkit.models import BertForCausalLM, class_for

        role = _role(role)
        if role == "generate":
            role = "seq2seq" if self.text_to_text else "causal"
        if role != "causal":
            try:
                return class_for(self.config, role, str(self.path))
            except ValueError as err:
                raise ValueError(f"{kind}: {err}" if kind else str(err)) from None
        if not self.causal:  # BertForCausalLM: the BERT family's with is_decoder (not a row of the role table)
            raise ValueError(f"{self.path}: not a causal model (config.json has no is_decoder: true); generation "
                             f"needs one pretrained with --objective causal, or an encoder-decoder (T5)")
        return BertForCausalLM

    def load(self, role: str, **kwargs: Any):
        """The model for `role` (see `model_class`), strictly loaded from the directory (`from_pretrained`).

        The bare encoder ("encoder", "embeddings", "features") of a token-classification or QA directory, which
        has no pooler, is loaded without one.
        """
        from bertkit.checkpoint import WeightsMismatchError

        cls = self.model_class(role)
        if _role(role) != "encoder":
            return cls.from_pretrained(self.path, **kwargs)
        try:
            return cls.from_pretrained(self.path, **kwargs)
        except WeightsMismatchError as err:
            if not any(name.startswith("pooler.") for name in err.missing):
                raise
            return cls.from_pretrained(self.path, **{**kwargs, "add_pooler": False})


def model_class(directory: str | os.PathLike, role: str) -> type:
    """`ModelDir.open(directory).model_class(role)`: the class that loads `directory` for `role`."""
    return ModelDir.open(directory).model_class(role)
