"""What every config class shares: the config.json name, the checks its fields go through, `ConfigFile` (the
JSON io and presets of every architecture's frozen dataclass) and the fields of one-line help the CLI reads."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, ClassVar

from bertkit.io import read_json_object

CONFIG_NAME = "config.json"  # a model directory's config file (the one place its name is written)
IGNORE_INDEX = -100  # the label value every loss skips (unmasked positions, padding, sub-words without a tag)

# Activations the feed-forward block and the MLM head understand, by their transformers names.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")

# config.json keys that carry no architectural meaning for an encoder; read and dropped.
IGNORED_CONFIG_KEYS = {
    "_name_or_path", "architectures", "transformers_version", "model_type", "use_cache", "gradient_checkpointing",
    "torch_dtype", "dtype", "classifier_dropout", "bos_token_id", "eos_token_id", "tie_word_embeddings",
    "add_cross_attention", "is_decoder", "output_past", "chunk_size_feed_forward", "output_hidden_states",
    "output_attentions", "return_dict", "directionality", "pooler_fc_size", "pooler_num_attention_heads",
    "pooler_num_fc_layers", "pooler_size_per_head", "pooler_type", "problem_type", "id2label", "label2id",
    "finetuning_task", "tokenizer_class", "prefix", "sep_token_id", "decoder_start_token_id", "task_specific_params",
    "torchscript", "pruned_heads", "is_encoder_decoder", "tf_legacy_loss", "use_bfloat16",
}


MAX_SIZE = 2**31 - 1  # the largest size field (vocabulary, widths, positions) a config may hold


def check_finite(config: Any, names: tuple[str, ...]) -> None:
    """ValueError naming the first of `config`'s fields `names` that is not a real, finite number (NaN and
    infinities pass every range check, so they are refused here first; so are strings and booleans)."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{type(config).__name__}.{name} must be a finite number, got {value!r}")


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# A field rule -> (the test a value passes, what the error says it must be); "RULE or None" also lets None pass.
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "positive integer": (lambda v: _integer(v) and v > 0, "be a positive integer"),
    "non-negative integer": (lambda v: _integer(v) and v >= 0, "be a non-negative integer"),
    "integer": (_integer, "be an integer"),
    "positive number": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf,
                        "be a positive number"),
    "probability": (lambda v: 0.0 <= v <= 1.0, "be in [0, 1]"),
    "boolean": (lambda v: isinstance(v, bool), "be true or false"),
}


def check_fields(config: Any, names: tuple[str, ...], rule: str) -> None:
    """ValueError naming the first of `config`'s fields `names` that breaks `rule`, a key of _RULES ("positive
    integer": an int, not a bool, above 0; "probability": in [0, 1]; ...) optionally followed by " or None"; an
    integer beyond MAX_SIZE (larger than any tensor dimension torch indexes) is refused too."""
    base = rule.removesuffix(" or None")
    test, said = _RULES[base]
    for name in names:
        value = getattr(config, name)
        if value is None and base != rule:
            continue
        if not test(value):
            raise ValueError(f"{type(config).__name__}.{name} must {said}{rule[len(base):]}, got {value!r}")
        if _integer(value) and value > MAX_SIZE:  # the memory check never sees these
            raise ValueError(f"{type(config).__name__}.{name} {value} is absurdly large (at most {MAX_SIZE})")


def check_choice(config: Any, name: str, choices: tuple) -> None:
    """ValueError naming field `name` of `config` when its value is not one of `choices`."""
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"{type(config).__name__}.{name} {value!r} is not supported by bertkit; choose one of "
                         f"{', '.join(map(str, choices))}")


def check_token_ids(config: Any, names: tuple[str, ...]) -> None:
    """ValueError naming the first of the token-id fields `names` that is not an id of the vocabulary."""
    for name in names:
        value = getattr(config, name)
        if not _integer(value) or not 0 <= value < config.vocab_size:
            raise ValueError(f"{type(config).__name__}.{name} {value!r} is outside the vocabulary "
                             f"(vocab_size {config.vocab_size})")


def field_with_help(default: Any, help: str) -> Any:
    """A dataclass field carrying its help text: the CLI builds its options and `--help` from these."""
    return dataclasses.field(default=default, metadata={"help": help})


def with_article(label: str) -> str:
    """"a T5", "an XLNet", "an ELMo": a display label with the article its first letter's sound takes."""
    return f"{'an' if label[:1] in 'AEIOX' else 'a'} {label}"


class ConfigFile:
    """config.json io that every architecture's config shares; each brings `to_dict` and `from_dict(data, source)`,
    its `model_type` and its size `PRESETS`."""

    LABEL: ClassVar[str] = ""  # how messages and the docs name it ("T5"; see `label_of`, `with_article`)
    # config.json keys read besides the fields (and checked by from_dict), and keys read and dropped
    EXTRA_KEYS: ClassVar[frozenset[str]] = frozenset()
    IGNORED_KEYS: ClassVar[frozenset[str]] = frozenset()
    # config.json keys that must hold one value (compared by identity) for bertkit to build it: key -> (value, why)
    REQUIRED: ClassVar[dict[str, tuple[Any, str]]] = {}

    @classmethod
    def model_types(cls) -> tuple[str, ...]:
        """The config.json model_types this class reads (BertConfig: the whole BERT family)."""
        return (cls.model_type,)

    @classmethod
    def label_of(cls, model_type: str) -> str:
        """How messages and the docs name a model of `model_type` (one of `model_types()`): the one display label of
        each architecture (the registry's rows, checkpoint's messages and the config's own read it here)."""
        return cls.LABEL

    # the fields a row of PRESETS gives, in its order
    PRESET_FIELDS: ClassVar[tuple[str, ...]] = ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                                "intermediate_size")

    @classmethod
    def preset(cls, name: str, **overrides: Any):
        """A size preset of PRESETS with fields over it (tiny, mini, small, ...); a `model_type` among them (a recipe's
        model section names its architecture so) must be this class's. ValueError for another model_type or an
        unknown preset."""
        if overrides.pop("model_type", cls.model_type) != cls.model_type:
            raise ValueError(f"{cls.__name__}.preset builds model_type {cls.model_type!r} only")
        if name not in cls.PRESETS:
            raise ValueError(f"unknown {cls.LABEL} size preset {name!r}; choose one of "
                             f"{', '.join(cls.PRESETS)}")
        return cls(**{**dict(zip(cls.PRESET_FIELDS, cls.PRESETS[name])), **overrides})

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def max_length(self) -> int:
        """The longest input the model takes."""
        return self.max_position_embeddings

    def field_dict(self) -> dict[str, Any]:
        """Every field under its own name: the config.json keys of an architecture whose fields are its keys."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def read_fields(cls, data: dict[str, Any], source: str) -> dict[str, Any]:
        """The fields a config.json dict gives, strictly: a model_type other than the class's, any key that is
        neither a field nor one of EXTRA_KEYS / IGNORED_KEYS / REQUIRED, and a REQUIRED key of another value, are
        refused naming it and `source` (the file)."""
        if data.get("model_type") != cls.model_type:
            raise ValueError(f"{source}: model_type {data.get('model_type')!r} is not "
                             f"{with_article(cls.LABEL)} config")
        names = {f.name for f in dataclasses.fields(cls)}
        known = names | cls.EXTRA_KEYS | cls.IGNORED_KEYS | set(cls.REQUIRED)
        unknown = sorted(k for k in data if k not in known)
        if unknown:
            raise ValueError(f"{source}: unknown config keys {unknown}")
        for key, (want, why) in cls.REQUIRED.items():
            if key in data and data[key] is not want:
                raise ValueError(f"{source}: {key}={data[key]!r} is not supported by bertkit ({why})")
        return {name: data[name] for name in names if name in data}

    @classmethod
    def build(cls, fields: dict[str, Any], source: str):
        """cls(**fields), a wrong type or value refused in one line naming `source` (the file)."""
        try:
            return cls(**fields)
        except (TypeError, ValueError) as err:
            key = next((k for k in sorted(fields, key=len, reverse=True) if f".{k} " in str(err)), None)
            raise ValueError(f"{source}: {err}" + (f" (config key {key!r})" if key else "")) from None

    def json_dict(self) -> dict[str, Any]:
        """The keys config.json gets (a config whose `to_dict` leaves some out adds them here)."""
        return self.to_dict()

    def to_json_file(self, path: str | os.PathLike, architectures: list[str] | None = None,
                     extra: dict[str, Any] | None = None) -> None:
        """Write `config.json` in transformers' form (its extra keys included so its loaders are at home).

        extra: further transformers keys a task model needs (id2label, label2id, problem_type).
        """
        data = self.json_dict()
        if architectures:
            data["architectures"] = architectures
        data.update(extra or {})
        Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    @classmethod
    def from_json_file(cls, path: str | os.PathLike):
        """Read a config.json (ValueError naming the file when it is not a JSON object)."""
        return cls.from_dict(read_json_object(path, "config file"), source=str(path))
