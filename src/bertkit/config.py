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
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Activations the feed-forward block and the MLM head understand, by their transformers names.
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


_SAME = {f: f for f in _BERT_FIELDS}
FAMILIES: dict[str, Family] = {
    "bert": Family(keys=_SAME, optional={"causal": "is_decoder"}, pair_head=True,
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
    # ELECTRA: the embedding projection exists only when embedding_size differs from hidden_size; no pooler.
    "electra": Family(keys={**_SAME, "embedding_size": "embedding_size"}, optional={"causal": "is_decoder"},
                      written={"tie_word_embeddings": True}, pooler=False, head_act="gelu",
                      ignored=frozenset({"summary_type", "summary_use_proj", "summary_activation",
                                         "summary_last_dropout", "summary_first_dropout"})),
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
                         ignored=frozenset({"qa_dropout", "seq_classif_dropout", "tie_weights_"})),
}


def field_with_help(default: Any, help: str) -> Any:
    """A dataclass field carrying its help text: the CLI builds its options and `--help` from these."""
    return dataclasses.field(default=default, metadata={"help": help})


_f = field_with_help


@dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of a BERT-family encoder; names and defaults are those of BERT-base in transformers."""

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

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"BertConfig.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.type_vocab_size, int) or self.type_vocab_size < 0:
            raise ValueError(f"BertConfig.type_vocab_size must be a non-negative integer, got {self.type_vocab_size!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"BertConfig: num_attention_heads ({self.num_attention_heads}) must divide "
                             f"hidden_size ({self.hidden_size})")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"BertConfig.{name} must be in [0, 1], got {getattr(self, name)!r}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"BertConfig.hidden_act {self.hidden_act!r} is not supported; choose one of {ACTIVATIONS}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"BertConfig.pad_token_id {self.pad_token_id} is outside the vocabulary "
                             f"(vocab_size {self.vocab_size})")
        if self.initializer_range <= 0 or self.layer_norm_eps <= 0:
            raise ValueError("BertConfig.initializer_range and layer_norm_eps must be positive")
        self._check_family()

    def _check_family(self) -> None:
        """Refuse a combination of fields that the on-disk family cannot write (so every config can be saved)."""
        family = FAMILIES.get(self.model_type)
        if family is None:
            raise ValueError(f"BertConfig.model_type {self.model_type!r} is not supported; choose one of "
                             f"{', '.join(FAMILIES)}")
        if self.embedding_size is not None and (not isinstance(self.embedding_size, int) or self.embedding_size <= 0):
            raise ValueError(f"BertConfig.embedding_size must be a positive integer or None, "
                             f"got {self.embedding_size!r}")
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
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

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
        if self.model_type != "bert":
            data["model_type"] = self.model_type
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "BertConfig":
        """Build from a transformers-style dict of any supported family; `source` names the file in errors."""
        model_type = data.get("model_type") or "bert"
        family = FAMILIES.get(model_type)
        if family is None:
            raise ValueError(f"{source}: model_type {model_type!r} is not a BERT-family config (bertkit reads "
                             f"{', '.join(FAMILIES)})")
        required = {k: v for k, v in {**_REQUIRED_VALUES, **family.required}.items()
                    if k not in family.optional.values()}
        for key, want in required.items():
            if key in data and data[key] != want:
                raise ValueError(f"{source}: {key}={data[key]!r} is not supported by bertkit (only {want!r})")
        keys = {**family.keys, **family.optional}
        known = set(keys.values()) | set(family.written) | set(required) | family.ignored | _IGNORED_KEYS
        if model_type == "distilbert":  # transformers aliases these to dim/n_heads/n_layers
            known |= {"hidden_size", "num_attention_heads", "num_hidden_layers"}
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
        try:
            return cls(**fields)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{source}: {err}") from None

    def to_json_file(self, path: str | os.PathLike, architectures: list[str] | None = None,
                     extra: dict[str, Any] | None = None) -> None:
        """Write `config.json` in transformers' form (its extra keys included so its loaders are at home).

        extra: further transformers keys a task model needs (id2label, label2id, problem_type).
        """
        data = self.to_dict()
        data.update(model_type=self.model_type, **self.family.written)
        if architectures:
            data["architectures"] = architectures
        data.update(extra or {})
        Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "BertConfig":
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no such config file") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: not a valid JSON config ({err})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a config must be a JSON object")
        return cls.from_dict(data, source=str(path))


# name -> (layers L, hidden H); heads A = H/64 and intermediate 4H follow the BERT papers.
PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}
