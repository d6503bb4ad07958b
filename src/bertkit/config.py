"""Model configuration: `BertConfig`, one frozen dataclass for BERT and its family, with transformers' config.json.

The BERT family differs in a few precise places, and each is a field here rather than another class:

    model_type                 the on-disk family: bert, roberta, albert, electra or distilbert
    embedding_size             factorised embeddings: vocab x E tables, then a learned E -> H map (ALBERT, ELECTRA)
    num_hidden_groups          cross-layer sharing: L layers run with only this many distinct weight sets (ALBERT)
    padding_offset_positions   position ids count from pad_token_id + 1 and padding keeps pad_token_id (RoBERTa)
    causal                     each token attends only to itself and the tokens before it (GPT-style)

A `config.json` written here is read by the transformers config class of `model_type` (`BertConfig`,
`RobertaConfig`, `AlbertConfig`, `ElectraConfig`, `DistilBertConfig`), and one written by transformers is read
here: `FAMILIES` says, per family, which config.json key holds each field. Keys transformers adds for its own
machinery (`architectures`, `transformers_version`, `use_cache`, ...) are accepted and ignored; keys that would
change the architecture in a way bertkit does not implement (relative position embeddings, cross-attention,
sinusoidal positions) are refused.

ModernBERT, T5, XLNet and ELMo are other architectures, each with a config class of its own (transformers' keys,
its size presets in `PRESETS`); `config_class_for(model_type)` picks the class for a model_type, by the class's own
`model_type`. The other facts about each architecture live in its row of `bertkit.models.registry`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

from bertkit.io import read_json_object

# Activations the feed-forward block and the MLM head understand, by their transformers names.
CONFIG_NAME = "config.json"  # a model directory's config file (the one place its name is written)
IGNORE_INDEX = -100  # the label value every loss skips (unmasked positions, padding, sub-words without a tag)

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")

# config.json keys that carry no architectural meaning for an encoder; read and dropped.
_IGNORED_KEYS = {
    "_name_or_path", "architectures", "transformers_version", "model_type", "use_cache", "gradient_checkpointing",
    "torch_dtype", "dtype", "classifier_dropout", "bos_token_id", "eos_token_id", "tie_word_embeddings",
    "add_cross_attention", "is_decoder", "output_past", "chunk_size_feed_forward", "output_hidden_states",
    "output_attentions", "return_dict", "directionality", "pooler_fc_size", "pooler_num_attention_heads",
    "pooler_num_fc_layers", "pooler_size_per_head", "pooler_type", "problem_type", "id2label", "label2id",
    "finetuning_task", "tokenizer_class", "prefix", "sep_token_id", "decoder_start_token_id", "task_specific_params",
    "torchscript", "pruned_heads", "is_encoder_decoder", "tf_legacy_loss", "use_bfloat16",
}
# Keys whose value must be exactly this for bertkit to compute the same function as the checkpoint's author.
_REQUIRED_VALUES = {"position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False}

# The 13 fields of BERT's config.json, in BertConfig's order; every family has them (DistilBERT under other names).
_BERT_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id")


@dataclass(frozen=True)
class Family:
    """How one transformers model family spells a config, and the few architectural facts it fixes."""

    keys: dict[str, str]  # BertConfig field -> config.json key, always written
    optional: dict[str, str] = dataclasses.field(default_factory=dict)  # same, written only when not the default
    fixed: dict[str, Any] = dataclasses.field(default_factory=dict)  # fields this family pins to one value
    written: dict[str, Any] = dataclasses.field(default_factory=dict)  # constant config.json keys we write
    required: dict[str, Any] = dataclasses.field(default_factory=dict)  # config.json keys that must have this value
    ignored: frozenset[str] = frozenset()  # family-specific keys read and dropped (their heads' dropout, ...)
    pair_head: bool = False  # the pretraining model has a sentence-pair head on the pooler (NSP, SOP)
    pooler: bool = True  # the bare encoder has a pooler (ELECTRA and DistilBERT have none)
    head_act: str | None = None  # the MLM head's activation when the family hard-codes one (else hidden_act)
    projection_always: bool = False  # embedding_size is always projected, even when equal to hidden_size (ALBERT)
    aliases: frozenset[str] = frozenset()  # BERT's names of renamed keys, which transformers also accepts (read)
    writes_model_type: bool = True  # config.json names its model_type (BERT's, the default, is left out)


_SAME = {f: f for f in _BERT_FIELDS}
FAMILIES: dict[str, Family] = {
    "bert": Family(keys=_SAME, optional={"causal": "is_decoder", "classifier_pooling": "classifier_pooling"},
                   pair_head=True, writes_model_type=False,
                   written={"position_embedding_type": "absolute", "tie_word_embeddings": True}),
    # RoBERTa: BERT's fields, positions offset past the padding id, an LM head with a hard-coded exact GELU.
    "roberta": Family(keys={**_SAME, "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id"},
                      optional={"causal": "is_decoder"}, fixed={"padding_offset_positions": True},
                      written={"tie_word_embeddings": True}, head_act="gelu"),
    # ALBERT: factorised embeddings and shared layers; one layer per group (inner_group_num 1) is all we build.
    "albert": Family(keys={**_SAME, "embedding_size": "embedding_size", "num_hidden_groups": "num_hidden_groups",
                           "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id"},
                     written={"inner_group_num": 1, "tie_word_embeddings": True},
                     # Google's released configs carry switches of never-released variants, all off.
                     required={"inner_group_num": 1, "down_scale_factor": 1, "gap_size": 0, "net_structure_type": 0,
                               "num_memory_blocks": 0},
                     ignored=frozenset({"classifier_dropout_prob"}), pair_head=True, projection_always=True),
    # ELECTRA: the embedding projection exists only when embedding_size differs from hidden_size; no pooler. The
    # multiple-choice head is the sequence summary transformers' defaults describe (bertkit.models.heads).
    "electra": Family(keys={**_SAME, "embedding_size": "embedding_size"}, optional={"causal": "is_decoder"},
                      written={"tie_word_embeddings": True}, pooler=False, head_act="gelu",
                      required={"summary_type": "first", "summary_use_proj": True, "summary_activation": "gelu"},
                      ignored=frozenset({"summary_last_dropout", "summary_first_dropout"})),
    # DistilBERT: other key names, no token types, LayerNorm epsilon hard-coded to 1e-12, no pooler.
    "distilbert": Family(keys={"vocab_size": "vocab_size", "hidden_size": "dim", "num_hidden_layers": "n_layers",
                               "num_attention_heads": "n_heads", "intermediate_size": "hidden_dim",
                               "hidden_act": "activation", "hidden_dropout_prob": "dropout",
                               "attention_probs_dropout_prob": "attention_dropout",
                               "max_position_embeddings": "max_position_embeddings",
                               "initializer_range": "initializer_range", "pad_token_id": "pad_token_id"},
                         fixed={"type_vocab_size": 0, "layer_norm_eps": 1e-12},
                         written={"sinusoidal_pos_embds": False, "tie_word_embeddings": True},
                         required={"sinusoidal_pos_embds": False}, pooler=False,
                         # transformers aliases these to dim / n_heads / n_layers
                         aliases=frozenset({"hidden_size", "num_attention_heads", "num_hidden_layers"}),
                         ignored=frozenset({"qa_dropout", "seq_classif_dropout", "tie_weights_"})),
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


_f = field_with_help


class ConfigFile:
    """config.json io that every architecture's config shares; each brings `to_dict` and `from_dict(data, source)`,
    its `model_type` and its size `PRESETS`."""

    LABEL: ClassVar[str] = ""  # how errors name the architecture, with its article ("a T5", "an XLNet")
    # config.json keys read besides the fields (and checked by from_dict), and keys read and dropped
    EXTRA_KEYS: ClassVar[frozenset[str]] = frozenset()
    IGNORED_KEYS: ClassVar[frozenset[str]] = frozenset()
    # config.json keys that must hold one value (compared by identity) for bertkit to build it: key -> (value, why)
    REQUIRED: ClassVar[dict[str, tuple[Any, str]]] = {}

    @classmethod
    def model_types(cls) -> tuple[str, ...]:
        """The config.json model_types this class reads (BertConfig: the whole BERT family)."""
        return (cls.model_type,)

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
            raise ValueError(f"unknown {cls.LABEL.split(' ', 1)[-1]} size preset {name!r}; choose one of "
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
            raise ValueError(f"{source}: model_type {data.get('model_type')!r} is not {cls.LABEL} config")
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


# name -> (layers L, hidden H); heads A = H/64 and intermediate 4H follow the BERT papers.
PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}


@dataclass(frozen=True)
class BertConfig(ConfigFile):
    """Hyper-parameters of a BERT-family encoder; names and defaults are those of BERT-base in transformers."""

    PRESETS: ClassVar[dict[str, tuple]] = PRESETS  # the size presets `preset` builds

    vocab_size: int = _f(30522, 'rows of the word-embedding matrix (and of the MLM output layer)')
    hidden_size: int = _f(768, 'H: width of every hidden state')
    num_hidden_layers: int = _f(12, 'L: number of encoder layers')
    num_attention_heads: int = _f(12, 'A: heads per self-attention; must divide H')
    intermediate_size: int = _f(3072, 'width of the feed-forward block, 4H in the paper')
    hidden_act: str = _f("gelu", 'feed-forward and MLM-head activation; "gelu" is the exact (erf) GELU')
    hidden_dropout_prob: float = _f(0.1, 'dropout on embeddings and on every residual branch')
    attention_probs_dropout_prob: float = _f(0.1, 'dropout on attention probabilities')
    max_position_embeddings: int = _f(512, 'rows of the learned position table')
    type_vocab_size: int = _f(2, 'number of token types (segments A and B); 0 = no token-type embedding')
    initializer_range: float = _f(0.02, 'standard deviation of the normal initialisation')
    layer_norm_eps: float = _f(1e-12, 'LayerNorm epsilon')
    pad_token_id: int = _f(0, 'id of the padding token; RoBERTa positions count from it')
    # ---- the family's variants (all off for BERT) -----------------------------------------------------------
    model_type: str = _f("bert", 'on-disk family: bert, roberta, albert, electra or distilbert')
    embedding_size: int | None = _f(None, 'E: embedding width, projected to H (ALBERT, ELECTRA); None = H, no '
                                          'projection (ELECTRA: E = H means None)')
    num_hidden_groups: int | None = _f(None, 'distinct layer weight sets shared across the L layers (ALBERT); '
                                             'None = every layer its own')
    padding_offset_positions: bool = _f(False, 'position ids start at pad_token_id + 1, padding gets '
                                               'pad_token_id (RoBERTa)')
    causal: bool = _f(False, 'causal self-attention: token t sees tokens <= t only (GPT-style LM)')
    bos_token_id: int | None = _f(None, 'beginning-of-sequence id written to config.json (RoBERTa <s>, ALBERT [CLS])')
    eos_token_id: int | None = _f(None, 'end-of-sequence id written to config.json (RoBERTa </s>, ALBERT [SEP])')
    classifier_pooling: str = _f("cls", 'BERT sequence classification reads the pooled first token ("cls", the '
                                        'paper\'s) or the mean of the real tokens ("mean", a bertkit variant for '
                                        'encoders pretrained without a sentence objective; transformers reads "cls")')

    def __post_init__(self) -> None:
        if self.classifier_pooling not in ("cls", "mean"):
            raise ValueError(f"BertConfig.classifier_pooling must be cls or mean, got {self.classifier_pooling!r}")
        check_fields(self, ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                            "intermediate_size", "max_position_embeddings"), "positive integer")
        check_fields(self, ("type_vocab_size",), "non-negative integer")
        check_fields(self, ("bos_token_id", "eos_token_id"), "integer or None")
        check_finite(self, ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range",
                            "layer_norm_eps"))
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"BertConfig: num_attention_heads ({self.num_attention_heads}) must divide "
                             f"hidden_size ({self.hidden_size})")
        check_fields(self, ("hidden_dropout_prob", "attention_probs_dropout_prob"), "probability")
        check_choice(self, "hidden_act", ACTIVATIONS)
        check_token_ids(self, ("pad_token_id",))
        check_fields(self, ("initializer_range", "layer_norm_eps"), "positive number")
        self._check_family()

    def _check_family(self) -> None:
        """Refuse a combination of fields that the on-disk family cannot write (so every config can be saved)."""
        family = FAMILIES.get(self.model_type)
        if family is None:
            raise ValueError(f"BertConfig.model_type {self.model_type!r} is not supported; choose one of "
                             f"{', '.join(FAMILIES)}")
        check_fields(self, ("embedding_size",), "positive integer or None")
        groups = self.num_hidden_groups
        if groups is not None and not (isinstance(groups, int) and 1 <= groups <= self.num_hidden_layers):
            raise ValueError(f"BertConfig.num_hidden_groups must be in [1, num_hidden_layers="
                             f"{self.num_hidden_layers}] or None, got {groups!r}")
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, value in family.fixed.items():
            if getattr(self, name) != value:
                raise ValueError(f"BertConfig.{name} must be {value!r} for model_type {self.model_type!r}, "
                                 f"got {getattr(self, name)!r}")
        for name, default in defaults.items():
            if name in family.keys or name in family.optional or name in family.fixed or name == "model_type":
                continue
            if getattr(self, name) != default:
                raise ValueError(f"BertConfig.{name}={getattr(self, name)!r} cannot be written in the "
                                 f"{self.model_type!r} format; families with {name}: "
                                 f"{', '.join(k for k, f in FAMILIES.items() if name in f.keys or name in f.optional)}")
        if self.type_vocab_size == 0 and family.fixed.get("type_vocab_size") != 0:
            raise ValueError(f"BertConfig.type_vocab_size 0 (no token types) is a DistilBERT setting; "
                             f"{self.model_type!r} needs at least 1")
        if family.projection_always and self.embedding_size is None:
            raise ValueError(f"model_type {self.model_type!r} always projects its embeddings; set embedding_size")
        if not family.projection_always and self.embedding_size == self.hidden_size:
            # ELECTRA writes E = H for "no factorisation": normalise, so both spellings are one config.
            object.__setattr__(self, "embedding_size", None)
        if self.padding_offset_positions and self.max_length < 1:
            raise ValueError(f"max_position_embeddings {self.max_position_embeddings} leaves no positions after the "
                             f"padding offset (pad_token_id {self.pad_token_id})")

    # ---- derived facts -------------------------------------------------------------------------------------
    @classmethod
    def model_types(cls) -> tuple[str, ...]:
        return tuple(FAMILIES)

    @property
    def family(self) -> Family:
        return FAMILIES[self.model_type]

    @property
    def embedding_width(self) -> int:
        """E: width of the embedding tables (and of the MLM head's output transform)."""
        return self.embedding_size or self.hidden_size

    @property
    def num_layer_weights(self) -> int:
        """How many distinct layers' weights the encoder holds (L without sharing)."""
        return self.num_hidden_groups or self.num_hidden_layers

    def layer_weights_index(self, layer: int) -> int:
        """Which weight set layer `layer` uses; transformers' ALBERT formula, so shares agree exactly."""
        return int(layer / (self.num_hidden_layers / self.num_layer_weights))

    @property
    def max_length(self) -> int:
        """The longest input the position table covers (RoBERTa spends pad_token_id + 1 rows on the offset)."""
        offset = self.pad_token_id + 1 if self.padding_offset_positions else 0
        return self.max_position_embeddings - offset

    @property
    def pair_head(self) -> bool:
        """Whether this family's pretraining model has a sentence-pair head (BERT's NSP, ALBERT's SOP)."""
        return self.family.pair_head

    @property
    def mlm_head_act(self) -> str:
        return self.family.head_act or self.hidden_act

    # ---- construction --------------------------------------------------------------------------------------
    @classmethod
    def for_family(cls, model_type: str, **fields: Any) -> "BertConfig":
        """A config of `model_type` with the values that family pins filled in (RoBERTa's positions, ...)."""
        if model_type not in FAMILIES:
            raise ValueError(f"unknown model_type {model_type!r}; choose one of {', '.join(FAMILIES)}")
        return cls(**{**FAMILIES[model_type].fixed, **fields, "model_type": model_type})

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "BertConfig":
        """A size preset (tiny, mini, small, medium, base, large): A = H/64 heads, intermediate 4H."""
        if name not in PRESETS:
            raise ValueError(f"unknown size preset {name!r}; choose one of {', '.join(PRESETS)}")
        layers, hidden = PRESETS[name]
        fields = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=max(1, hidden // 64),
                      intermediate_size=4 * hidden)
        fields.update(overrides)
        return cls(**fields)

    # ---- JSON io -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The config as transformers' config class of this family takes it (its key names).

        For BERT this is BertConfig's 13 fields (plus is_decoder for a causal model); other families add
        `model_type`, so `from_dict(to_dict())` rebuilds the same config.
        """
        family = self.family
        data = {key: getattr(self, name) for name, key in family.keys.items()}
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        data.update({key: getattr(self, name) for name, key in family.optional.items()
                     if getattr(self, name) != defaults[name]})
        if "embedding_size" in family.keys:
            data["embedding_size"] = self.embedding_width  # ELECTRA writes E = H when there is no projection
        if "num_hidden_groups" in family.keys:
            data["num_hidden_groups"] = self.num_layer_weights
        if family.writes_model_type:
            data["model_type"] = self.model_type
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "BertConfig":
        """Build from a transformers-style dict of any supported family; `source` names the file in errors."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: a config must be a JSON object, found "
                             f"{'null' if data is None else type(data).__name__}")
        model_type = data.get("model_type") or "bert"
        family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
        if family is None:
            raise ValueError(f"{source}: model_type {model_type!r} is not a BERT-family config (bertkit reads "
                             f"{', '.join(FAMILIES)})")
        required = {k: v for k, v in {**_REQUIRED_VALUES, **family.required}.items()
                    if k not in family.optional.values()}
        for key, want in required.items():
            if key in data and data[key] != want:
                raise ValueError(f"{source}: {key}={data[key]!r} is not supported by bertkit (only {want!r})")
        keys = {**family.keys, **family.optional}
        known = (set(keys.values()) | set(family.written) | set(required) | family.ignored | family.aliases
                 | _IGNORED_KEYS)
        unknown = sorted(k for k in data if k not in known)
        if unknown:
            raise ValueError(f"{source}: unknown config keys {unknown}")
        fields = {name: data[key] for name, key in keys.items() if key in data}
        fields.update(family.fixed)
        fields["model_type"] = model_type
        if "embedding_size" in family.keys:
            fields["embedding_size"] = data.get("embedding_size", 128)  # AlbertConfig's and ElectraConfig's default
        if "num_hidden_groups" in family.keys:
            groups = data.get("num_hidden_groups", 1)  # AlbertConfig's default: one weight set for every layer
            fields["num_hidden_groups"] = None if groups == fields.get("num_hidden_layers", 12) else groups
        try:  # no key hint: the family's config.json keys are not the field names (DistilBERT's `dim`)
            return cls(**fields)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{source}: {err}") from None

    def json_dict(self) -> dict[str, Any]:
        """config.json's keys: the fields under transformers' names, the family's model_type and constant keys."""
        return {**self.to_dict(), "model_type": self.model_type, **self.family.written}


# ==================================================================================================================
# ModernBERT
# ==================================================================================================================
# ModernBERT is its own architecture (rotary positions, GeGLU, pre-norm, alternating local/global attention), so
# it has its own config rather than BertConfig fields. Field names are transformers' ModernBertConfig keys.
MODERNBERT_POOLING = ("cls", "mean")
# config.json keys of transformers' ModernBertConfig that change nothing bertkit computes: kernel choices,
# transformers' sparse-prediction switch (bertkit's is `predict_at`), and leftovers found in released configs.
_MODERNBERT_IGNORED_KEYS = (_IGNORED_KEYS - {"classifier_dropout", "bos_token_id", "eos_token_id",
                                             "sep_token_id", "tie_word_embeddings"}) | {
    "deterministic_flash_attn", "sparse_prediction", "sparse_pred_ignore_index", "reference_compile",
    "repad_logits_with_grad", "layer_norm_eps", "position_embedding_type", "num_labels"}
_ROPE_KINDS = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}


# name -> (layers L, hidden H, heads A, intermediate I). base and large are the released ModernBERT shapes (deep and
# narrow: 64-wide heads, a GeGLU of 1.5H for base); the small ones keep base's proportions for CPU runs.
MODERNBERT_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 128, 2, 192),
    "mini": (4, 256, 4, 384),
    "small": (8, 384, 6, 576),
    "base": (22, 768, 12, 1152),
    "large": (28, 1024, 16, 2624),
}


@dataclass(frozen=True)
class ModernBertConfig(ConfigFile):
    """Hyper-parameters of a ModernBERT encoder; names and defaults are those of ModernBERT-base in transformers.

    Layer i attends globally when i % global_attn_every_n_layers == 0 and otherwise within a sliding window of
    `local_attention` tokens (a token sees the tokens at distance <= local_attention // 2 on either side).
    """

    model_type: ClassVar[str] = "modernbert"  # the on-disk family (transformers' model_type)
    LABEL: ClassVar[str] = "a ModernBERT"
    EXTRA_KEYS: ClassVar[frozenset[str]] = frozenset({"layer_types", "rope_parameters"})
    REQUIRED: ClassVar[dict[str, tuple[Any, str]]] = {
        "tie_word_embeddings": (True, "the MLM decoder is the token-embedding matrix: only true"),
        "rope_scaling": (None, "plain rotary embeddings only")}
    IGNORED_KEYS: ClassVar[frozenset[str]] = _MODERNBERT_IGNORED_KEYS
    PRESETS: ClassVar[dict[str, tuple]] = MODERNBERT_PRESETS  # the size presets `preset` builds

    vocab_size: int = _f(50368, 'rows of the token-embedding matrix (and of the MLM decoder)')
    hidden_size: int = _f(768, 'H: width of every hidden state')
    intermediate_size: int = _f(1152, 'I: width of the GeGLU feed-forward block (Wi produces 2I: input and gate)')
    num_hidden_layers: int = _f(22, 'L: number of encoder layers')
    num_attention_heads: int = _f(12, 'A: heads per self-attention; must divide H, and H / A must be even (rotary)')
    hidden_activation: str = _f("gelu", 'the GeGLU activation, applied to the input half; "gelu" is the exact GELU')
    max_position_embeddings: int = _f(8192, 'the longest input accepted (rotary positions have no table)')
    initializer_range: float = _f(0.02, 'standard deviation of the (truncated) normal initialisation')
    initializer_cutoff_factor: float = _f(2.0, 'initial weights are cut at +- this many standard deviations')
    norm_eps: float = _f(1e-5, 'LayerNorm epsilon')
    norm_bias: bool = _f(False, 'LayerNorms have a bias')
    pad_token_id: int = _f(50283, 'id of the padding token (its embedding gets no gradient)')
    eos_token_id: int | None = _f(50282, 'end-of-sequence id, written to config.json')
    bos_token_id: int | None = _f(50281, 'beginning-of-sequence id, written to config.json')
    cls_token_id: int | None = _f(50281, '[CLS] id, written to config.json')
    sep_token_id: int | None = _f(50282, '[SEP] id, written to config.json')
    global_rope_theta: float = _f(160000.0, 'rotary base of the global-attention layers')
    local_rope_theta: float = _f(10000.0, 'rotary base of the sliding-window layers')
    attention_bias: bool = _f(False, 'the query/key/value and attention output projections have biases')
    attention_dropout: float = _f(0.0, 'dropout on attention probabilities and on the attention output')
    global_attn_every_n_layers: int = _f(3, 'layers 0, n, 2n, ... attend globally, the others locally')
    local_attention: int = _f(128, 'sliding-window width: a token sees local_attention // 2 tokens either side')
    embedding_dropout: float = _f(0.0, 'dropout after the embedding LayerNorm')
    mlp_bias: bool = _f(False, 'the feed-forward projections have biases')
    mlp_dropout: float = _f(0.0, 'dropout between the GeGLU and its output projection')
    decoder_bias: bool = _f(True, 'the MLM decoder (tied to the token embeddings) has a bias')
    classifier_pooling: str = _f("cls", 'sequence classification reads the first token ("cls") or the mean of the '
                                        'real tokens ("mean")')
    classifier_dropout: float = _f(0.0, 'dropout before the classifier')
    classifier_bias: bool = _f(False, 'the prediction head\'s dense layer (MLM and classifiers) has a bias')
    classifier_activation: str = _f("gelu", 'activation of the prediction head (MLM and classifiers)')

    def __post_init__(self) -> None:
        check_fields(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "max_position_embeddings", "global_attn_every_n_layers",
                            "local_attention"), "positive integer")
        check_finite(self, ("initializer_range", "initializer_cutoff_factor", "norm_eps", "global_rope_theta",
                            "local_rope_theta", "attention_dropout", "embedding_dropout", "mlp_dropout",
                            "classifier_dropout"))  # NaN and infinities pass the range checks below
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"ModernBertConfig: num_attention_heads ({self.num_attention_heads}) must divide "
                             f"hidden_size ({self.hidden_size})")
        if self.head_dim % 2:
            raise ValueError(f"ModernBertConfig: the head size hidden_size / num_attention_heads = {self.head_dim} "
                             f"must be even (rotary embeddings turn pairs of dimensions)")
        check_fields(self, ("attention_dropout", "embedding_dropout", "mlp_dropout", "classifier_dropout"),
                     "probability")
        check_choice(self, "hidden_activation", ACTIVATIONS)
        check_choice(self, "classifier_activation", ACTIVATIONS)
        check_choice(self, "classifier_pooling", MODERNBERT_POOLING)
        check_token_ids(self, ("pad_token_id",))
        check_fields(self, ("initializer_range", "initializer_cutoff_factor", "norm_eps", "global_rope_theta",
                            "local_rope_theta"), "positive number")
        check_fields(self, ("norm_bias", "attention_bias", "mlp_bias", "decoder_bias", "classifier_bias"), "boolean")

    # ---- derived facts -------------------------------------------------------------------------------------

    @property
    def sliding_window(self) -> int:
        """How far a local layer's token sees on either side: local_attention // 2 (transformers' rule)."""
        return self.local_attention // 2

    def is_global(self, layer: int) -> bool:
        """Whether layer `layer` (from 0) attends over the whole sequence rather than a sliding window."""
        return layer % self.global_attn_every_n_layers == 0

    @property
    def layer_types(self) -> list[str]:
        """transformers' per-layer spelling of the attention pattern."""
        return ["full_attention" if self.is_global(i) else "sliding_attention" for i in range(self.num_hidden_layers)]

    # ---- JSON io -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The config as transformers' ModernBertConfig takes it: every field under its own name, the attention
        pattern and rotary bases both as the released configs spell them (global_attn_every_n_layers,
        global_rope_theta, local_rope_theta) and as current transformers does (layer_types, rope_parameters)."""
        data = self.field_dict()
        data.update(model_type=self.model_type, layer_types=self.layer_types, tie_word_embeddings=True,
                    rope_parameters={kind: {"rope_type": "default", "rope_theta": getattr(self, name)}
                                     for kind, name in _ROPE_KINDS.items()})
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "ModernBertConfig":
        """Build from a transformers ModernBERT config dict (current or released spelling); `source` names the
        file in errors. Unknown keys, and values bertkit does not build (untied decoder, scaled rotary, an
        irregular layer pattern, ...), are refused naming the key."""
        fields = cls.read_fields(data, source)
        for kind, params in (data.get("rope_parameters") or {}).items():
            if kind not in _ROPE_KINDS or not isinstance(params, dict):
                raise ValueError(f"{source}: rope_parameters has an unknown entry {kind!r}")
            extra = sorted(set(params) - {"rope_type", "rope_theta"})
            if params.get("rope_type", "default") != "default" or extra:
                what = f"rope_type={params.get('rope_type')!r}" if not extra else f"keys {extra}"
                raise ValueError(f"{source}: rope_parameters.{kind} {what} is not supported by bertkit (plain "
                                 f"rotary embeddings only)")
            if "rope_theta" in params:  # current transformers lets rope_parameters win over the released keys
                fields[_ROPE_KINDS[kind]] = params["rope_theta"]
        if data.get("layer_types") is not None:
            fields["global_attn_every_n_layers"] = _every_n(data["layer_types"], fields.get(
                "global_attn_every_n_layers"), fields.get("num_hidden_layers", 22), source)
        return cls.build(fields, source)


def _every_n(layer_types: Any, stated: Any, num_layers: Any, source: str) -> Any:
    """transformers' `layer_types` list -> global_attn_every_n_layers (the stated value when it agrees); a pattern
    that is not "global every n layers from layer 0" is refused."""
    if not isinstance(layer_types, list) or not all(t in _ROPE_KINDS for t in layer_types):
        raise ValueError(f"{source}: layer_types must be a list of {sorted(_ROPE_KINDS)}, got {layer_types!r}")
    if len(layer_types) != num_layers:
        raise ValueError(f"{source}: layer_types has {len(layer_types)} entries for num_hidden_layers={num_layers}")
    candidates = [stated] if isinstance(stated, int) and stated > 0 else []
    candidates += list(range(1, len(layer_types) + 1))
    for n in candidates:
        if all((t == "full_attention") == (i % n == 0) for i, t in enumerate(layer_types)):
            return n
    raise ValueError(f"{source}: layer_types {layer_types} is not supported by bertkit (global attention every "
                     f"n layers from layer 0 only)")


# ==================================================================================================================
# T5
# ==================================================================================================================
# T5 is an encoder-decoder with relative position biases and RMS norms, so it has its own config. Field names are
# transformers' T5Config keys, and config.json is read and written under them.
# feed_forward_proj -> the activation transformers derives from it (its `dense_act_fn`): T5 1.0's ReLU block and
# T5 1.1's gated block with the tanh GELU.
T5_FEED_FORWARD = {"relu": "relu", "gated-gelu": "gelu_new"}
# config.json keys of transformers' T5Config that change nothing bertkit computes: transformers' own machinery,
# T5ForSequenceClassification's dropout, and `n_positions`, which released configs carry although relative
# positions need no table.
_T5_IGNORED_KEYS = (_IGNORED_KEYS - {"eos_token_id", "tie_word_embeddings", "decoder_start_token_id",
                                     "is_encoder_decoder", "is_decoder"}) | {"n_positions", "num_labels"}


# name -> (layers per stack, d_model, heads, d_ff), heads of d_kv 64. small, base and large are the T5 paper's sizes
# (t5-small, t5-base, t5-large); tiny and mini keep their proportions for CPU runs.
T5_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (6, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


@dataclass(frozen=True)
class T5Config(ConfigFile):
    """Hyper-parameters of a T5 encoder-decoder; names and defaults are those of transformers' T5Config (t5-small).

    T5 1.0 is feed_forward_proj "relu" with the output projection tied to the shared embeddings (and the decoder
    output scaled by d_model**-0.5 before it); T5 1.1 is "gated-gelu" with an lm_head of its own, unscaled.
    """

    model_type: ClassVar[str] = "t5"  # the on-disk family (transformers' model_type)
    LABEL: ClassVar[str] = "a T5"
    EXTRA_KEYS: ClassVar[frozenset[str]] = frozenset({"dense_act_fn", "is_gated_act"})
    REQUIRED: ClassVar[dict[str, tuple[Any, str]]] = {
        "is_decoder": (False, "a T5 directory holds an encoder or an encoder-decoder: only false")}
    IGNORED_KEYS: ClassVar[frozenset[str]] = _T5_IGNORED_KEYS
    PRESETS: ClassVar[dict[str, tuple]] = T5_PRESETS  # the size presets `preset` builds
    PRESET_FIELDS: ClassVar[tuple[str, ...]] = ("num_layers", "d_model", "num_heads", "d_ff")

    vocab_size: int = _f(32128, 'rows of the shared embedding matrix (and of the output projection)')
    d_model: int = _f(512, 'width of every hidden state')
    d_kv: int = _f(64, 'width of one attention head\'s queries, keys and values (num_heads * d_kv need not be '
                       'd_model)')
    d_ff: int = _f(2048, 'width of the feed-forward block')
    num_layers: int = _f(6, 'encoder layers')
    num_decoder_layers: int | None = _f(None, 'decoder layers; None = num_layers')
    num_heads: int = _f(8, 'attention heads')
    relative_attention_num_buckets: int = _f(32, 'relative-position buckets (half per direction in the encoder)')
    relative_attention_max_distance: int = _f(128, 'distances from here on share the last bucket')
    dropout_rate: float = _f(0.1, 'dropout on embeddings, attention probabilities, residual branches, inside the '
                                  'feed-forward block and after the final norm')
    layer_norm_epsilon: float = _f(1e-6, 'epsilon of the RMS norms')
    initializer_factor: float = _f(1.0, 'scales every initial standard deviation (1.0 = T5\'s initialisation)')
    feed_forward_proj: str = _f("relu", 'feed-forward kind: "relu" (T5 1.0) or "gated-gelu" (T5 1.1, tanh GELU)')
    tie_word_embeddings: bool = _f(True, 'the output projection is the shared embedding matrix (T5 1.0); false: '
                                         'an lm_head of its own (T5 1.1)')
    scale_decoder_outputs: bool | None = _f(None, 'multiply the decoder output by d_model**-0.5 before the output '
                                                  'projection; None = T5\'s rule: exactly when tied')
    is_encoder_decoder: bool = _f(True, 'the directory holds a decoder (false: an encoder alone, T5EncoderModel)')
    pad_token_id: int = _f(0, 'id of the padding token')
    eos_token_id: int = _f(1, 'id of the end-of-sequence token </s>')
    decoder_start_token_id: int = _f(0, 'the decoder\'s first input token (T5: the padding id)')

    def __post_init__(self) -> None:
        check_finite(self, ("dropout_rate", "layer_norm_epsilon", "initializer_factor"))  # NaN passes range checks
        check_fields(self, ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads",
                            "relative_attention_num_buckets", "relative_attention_max_distance"), "positive integer")
        check_fields(self, ("num_decoder_layers",), "positive integer or None")
        check_choice(self, "feed_forward_proj", tuple(T5_FEED_FORWARD))
        # Each direction's buckets: half exact distances, half logarithmic up to max_distance; fewer than 4 buckets
        # or a max_distance inside the exact range leave the logarithmic half undefined (a division by log 1 = 0).
        if self.relative_attention_num_buckets < 4:
            raise ValueError(f"T5Config.relative_attention_num_buckets must be at least 4, got "
                             f"{self.relative_attention_num_buckets}")
        if self.relative_attention_max_distance <= self.relative_attention_num_buckets // 2:
            raise ValueError(f"T5Config.relative_attention_max_distance ({self.relative_attention_max_distance}) "
                             f"must exceed relative_attention_num_buckets // 2 "
                             f"({self.relative_attention_num_buckets // 2})")
        check_fields(self, ("dropout_rate",), "probability")
        check_fields(self, ("layer_norm_epsilon", "initializer_factor"), "positive number")
        check_fields(self, ("tie_word_embeddings", "is_encoder_decoder"), "boolean")
        check_fields(self, ("scale_decoder_outputs",), "boolean or None")
        check_token_ids(self, ("pad_token_id", "eos_token_id", "decoder_start_token_id"))

    # ---- derived facts -------------------------------------------------------------------------------------

    @property
    def decoder_layers(self) -> int:
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

    @property
    def inner_dim(self) -> int:
        """Width of the concatenated attention heads: num_heads * d_kv."""
        return self.num_heads * self.d_kv

    @property
    def gated(self) -> bool:
        """Whether the feed-forward block is gated (two input projections, T5 1.1)."""
        return self.feed_forward_proj.startswith("gated-")

    @property
    def activation(self) -> str:
        """The feed-forward activation by its transformers name (relu, or gelu_new: the tanh GELU)."""
        return T5_FEED_FORWARD[self.feed_forward_proj]

    @property
    def scale_output(self) -> bool:
        """Whether the decoder output is scaled by d_model**-0.5 before the output projection."""
        return self.tie_word_embeddings if self.scale_decoder_outputs is None else self.scale_decoder_outputs

    # ---- JSON io -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The config as transformers' T5Config takes it (and writes it: dense_act_fn and is_gated_act too).

        scale_decoder_outputs is written only where it departs from T5's rule (scaled exactly when tied), the one
        case older transformers versions cannot express.
        """
        data = self.field_dict()
        del data["scale_decoder_outputs"]
        data.update(num_decoder_layers=self.decoder_layers, model_type=self.model_type, is_decoder=False,
                    dense_act_fn=self.activation, is_gated_act=self.gated)
        if self.scale_output != self.tie_word_embeddings:
            data["scale_decoder_outputs"] = self.scale_output
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "T5Config":
        """Build from a transformers T5 config dict; `source` names the file in errors. Unknown keys, and values
        bertkit does not build (a decoder config, another feed-forward kind, several EOS ids), are refused naming
        the key."""
        fields = cls.read_fields(data, source)
        eos = fields.get("eos_token_id")
        if isinstance(eos, list):  # transformers allows a list of EOS ids; generation here stops on one
            if len(eos) != 1:
                raise ValueError(f"{source}: eos_token_id={eos!r} is not supported by bertkit (one id only)")
            fields["eos_token_id"] = eos[0]
        if fields.get("num_decoder_layers") == fields.get("num_layers", 6):
            fields["num_decoder_layers"] = None  # as many as the encoder: the default, so configs compare equal
        if fields.get("decoder_start_token_id") is None:  # T5's convention when the key is absent
            fields["decoder_start_token_id"] = fields.get("pad_token_id", 0)
        proj = fields.get("feed_forward_proj", "relu")
        derived = {"dense_act_fn": T5_FEED_FORWARD.get(proj), "is_gated_act": proj.startswith("gated-")}
        for key, want in derived.items():  # transformers writes these two, derived from feed_forward_proj
            if key in data and proj in T5_FEED_FORWARD and data[key] != want:
                raise ValueError(f"{source}: {key}={data[key]!r} contradicts feed_forward_proj={proj!r} (which "
                                 f"means {key}={want!r})")
        return cls.build(fields, source)


# ==================================================================================================================
# XLNet
# ==================================================================================================================
# XLNet is a Transformer-XL encoder (relative positions and segments, memory) trained by permutation language
# modelling, so it has its own config. Field names are transformers' XLNetConfig keys.
XLNET_SUMMARY_TYPES = ("last", "first", "mean")  # the sequence summary: the last token (<cls>), the first, the mean
XLNET_SUMMARY_ACTIVATIONS = (None, "tanh", "linear")  # after the summary projection ("linear": none)
# config.json keys of transformers' XLNetConfig that change nothing bertkit computes: transformers' machinery and
# the SQuAD beam head's sizes (bertkit's span head has no beam).
_XLNET_IGNORED_KEYS = (_IGNORED_KEYS - {"bos_token_id", "eos_token_id", "tie_word_embeddings"}) | {
    "start_n_top", "end_n_top", "num_labels", "n_token", "use_mems_eval", "use_mems_train", "layer_norm_epsilon"}


# name -> (layers L, d_model, heads, d_inner), heads of 64. base and large are the paper's XLNet-Base and -Large;
# tiny and mini keep their proportions for CPU runs (mini: the `mini` BERT's shape).
XLNET_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (4, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


@dataclass(frozen=True)
class XLNetConfig(ConfigFile):
    """Hyper-parameters of an XLNet; names and defaults are those of transformers' XLNetConfig (xlnet-large).

    bertkit builds the bidirectional XLNet (attn_type "bi"); the Transformer-XL decoder ("uni") is refused.
    """

    model_type: ClassVar[str] = "xlnet"  # the on-disk family (transformers' model_type)
    LABEL: ClassVar[str] = "an XLNet"
    REQUIRED: ClassVar[dict[str, tuple[Any, str]]] = {
        "tie_word_embeddings": (True, "the LM head is the token-embedding matrix: only true"),
        "summary_proj_to_labels": (False, "the summary projects to d_model: only false")}
    IGNORED_KEYS: ClassVar[frozenset[str]] = _XLNET_IGNORED_KEYS
    PRESETS: ClassVar[dict[str, tuple]] = XLNET_PRESETS  # the size presets `preset` builds
    PRESET_FIELDS: ClassVar[tuple[str, ...]] = ("n_layer", "d_model", "n_head", "d_inner")

    vocab_size: int = _f(32000, 'rows of the token-embedding matrix (and of the tied LM head)')
    d_model: int = _f(1024, 'H: width of every hidden state')
    n_layer: int = _f(24, 'L: number of layers')
    n_head: int = _f(16, 'N: attention heads; must divide d_model')
    d_inner: int = _f(4096, 'width of the feed-forward block')
    ff_activation: str = _f("gelu", 'feed-forward activation (transformers\' name; "gelu" is the exact GELU)')
    attn_type: str = _f("bi", 'attention kind: "bi" (XLNet) only')
    initializer_range: float = _f(0.02, 'standard deviation of the normal initialisation')
    layer_norm_eps: float = _f(1e-12, 'LayerNorm epsilon')
    dropout: float = _f(0.1, 'dropout on embeddings, positions, attention probabilities, residual branches, output')
    mem_len: int | None = _f(512, 'hidden states kept as memory for the next segment; None or 0 = all of them')
    reuse_len: int | None = _f(None, 'only the first reuse_len tokens of a segment go into the memory; None = all')
    bi_data: bool = _f(False, 'the second half of the batch reads relative positions backwards (pretraining)')
    clamp_len: int = _f(-1, 'relative distances beyond this are clamped; -1 = none')
    same_length: bool = _f(False, 'Transformer-XL\'s equal attention length (used by attn_type "uni" only)')
    summary_type: str = _f("last", 'the sequence summary reads the "last" token (<cls>), the "first", or the "mean"')
    summary_use_proj: bool = _f(True, 'a dense layer (d_model -> d_model) after the summary')
    summary_activation: str | None = _f("tanh", 'activation after that layer: "tanh", "linear" or None (none)')
    summary_last_dropout: float = _f(0.1, 'dropout after the summary')
    summary_first_dropout: float = _f(0.0, 'dropout before the summary projection')
    pad_token_id: int = _f(5, 'id of the padding token (<pad>)')
    bos_token_id: int | None = _f(1, 'beginning-of-sequence id <s>, written to config.json')
    eos_token_id: int | None = _f(2, 'end-of-sequence id </s>, written to config.json')
    d_head: int | None = _f(None, 'head size; None = d_model / n_head (the only value transformers accepts)')

    def __post_init__(self) -> None:
        check_fields(self, ("vocab_size", "d_model", "n_layer", "n_head", "d_inner"), "positive integer")
        check_finite(self, ("initializer_range", "layer_norm_eps", "dropout", "summary_last_dropout",
                            "summary_first_dropout"))
        if self.d_model % self.n_head:
            raise ValueError(f"XLNetConfig: n_head ({self.n_head}) must divide d_model ({self.d_model})")
        if self.d_head is not None and self.d_head != self.d_model // self.n_head:
            raise ValueError(f"XLNetConfig.d_head {self.d_head!r} must be d_model / n_head "
                             f"({self.d_model // self.n_head})")
        if self.attn_type != "bi":
            raise ValueError(f"XLNetConfig.attn_type {self.attn_type!r} is not supported by bertkit (\"bi\" only: "
                             f"XLNet's bidirectional attention; \"uni\" is the Transformer-XL decoder)")
        check_choice(self, "ff_activation", ACTIVATIONS)
        check_choice(self, "summary_type", XLNET_SUMMARY_TYPES)
        check_choice(self, "summary_activation", XLNET_SUMMARY_ACTIVATIONS)
        check_fields(self, ("mem_len", "reuse_len"), "non-negative integer or None")
        if self.reuse_len and self.mem_len and self.reuse_len > self.mem_len:
            raise ValueError(f"XLNetConfig: reuse_len ({self.reuse_len}) does not fit in mem_len ({self.mem_len})")
        check_fields(self, ("clamp_len",), "integer")
        check_fields(self, ("dropout", "summary_last_dropout", "summary_first_dropout"), "probability")
        check_fields(self, ("initializer_range", "layer_norm_eps"), "positive number")
        check_fields(self, ("bi_data", "same_length", "summary_use_proj"), "boolean")
        check_token_ids(self, ("pad_token_id",))

    # ---- derived facts (the names the other verbs read) ------------------------------------------------------

    @property
    def hidden_size(self) -> int:
        return self.d_model

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layer

    @property
    def num_attention_heads(self) -> int:
        return self.n_head

    @property
    def max_length(self) -> int:
        """The longest input the verbs feed: XLNet's relative positions have no table, so no limit of the model's
        own; 512 (the paper's pretraining length) bounds what the verbs cut inputs to."""
        return 512

    # ---- construction --------------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "XLNetConfig":
        """A size preset of XLNET_PRESETS (tiny, mini, small, base, large) with fields over it; the BERT spellings
        a recipe may carry (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
        max_position_embeddings) are mapped or dropped; `model_type="xlnet"` may be among them."""
        overrides.pop("max_position_embeddings", None)  # relative positions: no table to size
        for bert, ours in zip(ConfigFile.PRESET_FIELDS, cls.PRESET_FIELDS):
            if bert in overrides:
                overrides[ours] = overrides.pop(bert)
        return super().preset(name, **overrides)

    # ---- JSON io -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The config as transformers' XLNetConfig takes it (d_head written out, the LM head tied)."""
        data = self.field_dict()
        data.update(model_type=self.model_type, d_head=self.head_dim, tie_word_embeddings=True)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "XLNetConfig":
        """Build from a transformers XLNet config dict; `source` names the file in errors. Unknown keys, and values
        bertkit does not build (attn_type "uni", an untied LM head, a summary projected to the labels, ...), are
        refused naming the key."""
        fields = cls.read_fields(data, source)
        if "vocab_size" not in fields and "n_token" in data:  # the name of old configs
            fields["vocab_size"] = data["n_token"]
        if fields.get("summary_activation") == "":
            fields["summary_activation"] = None
        if isinstance(fields.get("eos_token_id"), list):
            fields["eos_token_id"] = fields["eos_token_id"][0] if fields["eos_token_id"] else None
        return dataclasses.replace(cls.build(fields, source), d_head=None)


# ------------------------------------------------------------------------------------------------------------------
# ELMo (bertkit.models.elmo): a character-CNN token encoder under a bidirectional LSTM language model
# ------------------------------------------------------------------------------------------------------------------
# name -> (char-CNN filters ((width, count), ...), highway layers, projection P, LSTM cell size, biLSTM layers).
# "original" is the released ELMo (Peters et al. 2018; allenai/bilm-tf options.json): 2048 filters, 2 highway
# layers, 512-wide projections of 4096-cell LSTMs, 2 layers; tiny and mini keep its shape for CPU runs.
ELMO_PRESETS: dict[str, tuple] = {
    "tiny": (((1, 8), (2, 8), (3, 16)), 1, 32, 64, 2),
    "mini": (((1, 32), (2, 32), (3, 64), (4, 128), (5, 128)), 2, 128, 512, 2),
    "small": (((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 256)), 2, 256, 1024, 2),
    "original": (((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024)), 2, 512, 4096, 2),
}


@dataclass(frozen=True)
class ElmoConfig(ConfigFile):
    """Hyper-parameters of an ELMo biLM (bilm-tf's options.json, in bertkit's names)."""

    model_type: ClassVar[str] = "elmo"  # the on-disk family (bertkit's own: transformers has no ELMo)
    LABEL: ClassVar[str] = "an ELMo"
    IGNORED_KEYS: ClassVar[frozenset[str]] = frozenset({"model_type", "architectures"})
    PRESETS: ClassVar[dict[str, tuple]] = ELMO_PRESETS  # the size presets `preset` builds
    PRESET_FIELDS: ClassVar[tuple[str, ...]] = ("filters", "num_highway", "projection_dim", "lstm_dim", "num_layers")

    vocab_size: int = _f(30000, 'words of the softmax (the word tokenizer\'s vocabulary)')
    char_vocab_size: int = _f(262, 'characters of the character embedding (the word tokenizer\'s, specials '
                                     'included)')
    max_characters: int = _f(50, 'characters per word, begin/end-of-word marks included; longer words are cut')
    char_embedding_dim: int = _f(16, 'width of one character\'s embedding')
    filters: tuple = _f(ELMO_PRESETS["original"][0], 'char-CNN filters as (width, count) pairs; their counts sum '
                                                      'to the CNN output width')
    num_highway: int = _f(2, 'highway layers after the convolutions')
    projection_dim: int = _f(512, 'P: the token vector and each LSTM output (one direction) after projection')
    lstm_dim: int = _f(4096, 'memory cells per LSTM (projected down to projection_dim when larger)')
    num_layers: int = _f(2, 'biLSTM layers (each a forward and a backward LSTM with weights of their own)')
    cell_clip: float | None = _f(None, 'clip LSTM cell values to [-x, x] (bilm-tf: 3; None: no clipping, which '
                                       'runs the fused nn.LSTM)')
    proj_clip: float | None = _f(None, 'clip projected LSTM outputs to [-x, x] (bilm-tf: 3; None: no clipping)')
    residual: bool = _f(True, 'add each biLSTM layer\'s input to its output from the second layer on')
    dropout: float = _f(0.1, 'dropout on every LSTM layer\'s input and on the softmax input')
    sampled_softmax: int = _f(0, 'train with a sampled softmax of this many log-uniform negative words per batch '
                                 '(0: the full softmax; evaluation is always full)')
    pad_token_id: int = _f(0, 'id of the padding word')

    def __post_init__(self) -> None:
        check_finite(self, ("dropout",))
        filters = tuple(tuple(int(v) for v in f) for f in self.filters) if isinstance(self.filters, (list, tuple)) \
            else self.filters
        object.__setattr__(self, "filters", filters)  # JSON gives lists; the config stays hashable
        if not filters or any(len(f) != 2 or f[0] < 1 or f[1] < 1 for f in filters):
            raise ValueError(f"ElmoConfig.filters must be (width, count) pairs of positive integers, got "
                             f"{self.filters!r}")
        check_fields(self, ("vocab_size", "char_vocab_size", "max_characters", "char_embedding_dim",
                            "projection_dim", "lstm_dim", "num_layers"), "positive integer")
        if self.max_characters < max(w for w, _ in filters):
            raise ValueError(f"ElmoConfig.max_characters ({self.max_characters}) is narrower than the widest "
                             f"filter ({max(w for w, _ in filters)})")
        if self.lstm_dim < self.projection_dim:
            raise ValueError(f"ElmoConfig.lstm_dim ({self.lstm_dim}) must be at least projection_dim "
                             f"({self.projection_dim})")
        check_fields(self, ("num_highway",), "non-negative integer")
        check_fields(self, ("cell_clip", "proj_clip"), "positive number or None")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ElmoConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.sampled_softmax, int) or not 0 <= self.sampled_softmax < self.vocab_size:
            raise ValueError(f"ElmoConfig.sampled_softmax must be 0 (full softmax) or a number of samples below "
                             f"vocab_size ({self.vocab_size}), got {self.sampled_softmax!r}")
        check_token_ids(self, ("pad_token_id",))


    @property
    def hidden_size(self) -> int:
        """Width of every layer ELMo outputs: 2P (the token layer is its P-wide vector twice, as in bilm-tf)."""
        return 2 * self.projection_dim

    @property
    def cnn_dim(self) -> int:
        """Width of the char-CNN output (the filters' counts summed)."""
        return sum(n for _, n in self.filters)

    def to_dict(self) -> dict[str, Any]:
        return {**self.field_dict(), "filters": [list(f) for f in self.filters], "model_type": "elmo"}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "ElmoConfig":
        return cls.build(cls.read_fields(data, source), source)


def config_class_for(model_type: str | None) -> type:
    """The config dataclass of a `model_type`: the config class that names it as its own (`model_type`, or for
    BertConfig any key of FAMILIES); BertConfig for None and for a model_type no class knows (whose from_dict then
    refuses it, naming the model_types bertkit reads)."""
    for cls in ConfigFile.__subclasses__():
        if model_type in cls.model_types():
            return cls
    return BertConfig


def presets_for(model_type: str | None) -> dict[str, tuple]:
    """The size presets `config_class_for(model_type).preset` knows."""
    return config_class_for(model_type).PRESETS


def config_from_dict(raw: dict[str, Any], source: str = "config") -> Any:
    """A config.json dict as the config class of its `model_type` (BertConfig for the BERT family)."""
    return config_class_for(raw.get("model_type") or "bert").from_dict(raw, source=source)
