"""`BertConfig`: one frozen dataclass for BERT and its family (RoBERTa, ALBERT, ELECTRA, DistilBERT, the causal
model), and `FAMILIES`: which config.json key holds each field in each family's spelling (see `bertkit.config`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from bertkit.config.base import (ACTIVATIONS, IGNORED_CONFIG_KEYS, ConfigFile, check_choice, check_fields,
                                 check_finite, check_token_ids)
from bertkit.config.base import field_with_help as _f

# Keys whose value must be exactly this for bertkit to compute the same function as the checkpoint's author.
_REQUIRED_VALUES = {"position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False}

# The 13 fields of BERT's config.json, in BertConfig's order; every family has them (DistilBERT under other names).
_BERT_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id")


@dataclass(frozen=True)
class Family:
    """How one transformers model family spells a config, and the few architectural facts it fixes."""

    label: str  # how messages and the docs name the family ("RoBERTa")
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
    "bert": Family("BERT", keys=_SAME,
                   optional={"causal": "is_decoder", "classifier_pooling": "classifier_pooling"},
                   pair_head=True, writes_model_type=False,
                   written={"position_embedding_type": "absolute", "tie_word_embeddings": True}),
    # RoBERTa: BERT's fields, positions offset past the padding id, an LM head with a hard-coded exact GELU.
    "roberta": Family("RoBERTa", keys={**_SAME, "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id"},
                      optional={"causal": "is_decoder"}, fixed={"padding_offset_positions": True},
                      written={"tie_word_embeddings": True}, head_act="gelu"),
    # ALBERT: factorised embeddings and shared layers; one layer per group (inner_group_num 1) is all we build.
    "albert": Family("ALBERT",
                     keys={**_SAME, "embedding_size": "embedding_size", "num_hidden_groups": "num_hidden_groups",
                           "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id"},
                     written={"inner_group_num": 1, "tie_word_embeddings": True},
                     # Google's released configs carry switches of never-released variants, all off.
                     required={"inner_group_num": 1, "down_scale_factor": 1, "gap_size": 0, "net_structure_type": 0,
                               "num_memory_blocks": 0},
                     ignored=frozenset({"classifier_dropout_prob"}), pair_head=True, projection_always=True),
    # ELECTRA: the embedding projection exists only when embedding_size differs from hidden_size; no pooler. The
    # multiple-choice head is the sequence summary transformers' defaults describe (bertkit.models.heads).
    "electra": Family("ELECTRA", keys={**_SAME, "embedding_size": "embedding_size"}, optional={"causal": "is_decoder"},
                      written={"tie_word_embeddings": True}, pooler=False, head_act="gelu",
                      required={"summary_type": "first", "summary_use_proj": True, "summary_activation": "gelu"},
                      ignored=frozenset({"summary_last_dropout", "summary_first_dropout"})),
    # DistilBERT: other key names, no token types, LayerNorm epsilon hard-coded to 1e-12, no pooler.
    "distilbert": Family("DistilBERT",
                         keys={"vocab_size": "vocab_size", "hidden_size": "dim", "num_hidden_layers": "n_layers",
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

    LABEL: ClassVar[str] = "BERT"  # a model_type's own label: `label_of` (FAMILIES)
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

    @classmethod
    def label_of(cls, model_type: str) -> str:
        return FAMILIES[model_type].label

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
                 | IGNORED_CONFIG_KEYS)
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
