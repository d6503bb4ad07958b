"""Model configuration: `BertConfig`, a frozen dataclass whose fields and `config.json` match transformers' BERT.

A `config.json` written here is read by `transformers.BertConfig`, and one written by transformers is read here:
the fields are the same names with the same meaning. Keys transformers adds for its own machinery
(`architectures`, `transformers_version`, `use_cache`, ...) are accepted and ignored; keys that would change
the architecture in a way bertkit does not implement (relative position embeddings, a decoder) are refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Activations the feed-forward block and the MLM head understand, by their transformers names.
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


def _f(default: Any, help: str) -> Any:  # a field with its help text (shown by `bertkit pretrain --help`)
    return dataclasses.field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of a BERT encoder; names and defaults are those of BERT-base in transformers."""

    vocab_size: int = _f(30522, 'rows of the word-embedding matrix (and of the MLM output layer)')
    hidden_size: int = _f(768, 'H: width of every hidden state')
    num_hidden_layers: int = _f(12, 'L: number of encoder layers')
    num_attention_heads: int = _f(12, 'A: heads per self-attention; must divide H')
    intermediate_size: int = _f(3072, 'width of the feed-forward block, 4H in the paper')
    hidden_act: str = _f("gelu", 'feed-forward and MLM-head activation; "gelu" is the exact (erf) GELU')
    hidden_dropout_prob: float = _f(0.1, 'dropout on embeddings and on every residual branch')
    attention_probs_dropout_prob: float = _f(0.1, 'dropout on attention probabilities')
    max_position_embeddings: int = _f(512, 'longest sequence the learned position table covers')
    type_vocab_size: int = _f(2, 'number of token types (segments A and B)')
    initializer_range: float = _f(0.02, 'standard deviation of the normal initialisation')
    layer_norm_eps: float = _f(1e-12, 'LayerNorm epsilon')
    pad_token_id: int = _f(0, 'id of [PAD]; its embedding row is not special, but it is written to config.json')

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"BertConfig.{name} must be a positive integer, got {value!r}")
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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    # ---- presets -------------------------------------------------------------------------------------------
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
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "BertConfig":
        """Build from a transformers-style dict; `source` names the file in error messages."""
        known = {f.name for f in dataclasses.fields(cls)}
        for key, want in _REQUIRED_VALUES.items():
            if key in data and data[key] != want:
                raise ValueError(f"{source}: {key}={data[key]!r} is not supported by bertkit (only {want!r})")
        model_type = data.get("model_type", "bert")
        if model_type not in ("bert", None):
            raise ValueError(f"{source}: model_type {model_type!r} is not a BERT config")
        unknown = sorted(k for k in data if k not in known and k not in _IGNORED_KEYS and k not in _REQUIRED_VALUES)
        if unknown:
            raise ValueError(f"{source}: unknown config keys {unknown}")
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except (TypeError, ValueError) as err:
            raise ValueError(f"{source}: {err}") from None

    def to_json_file(self, path: str | os.PathLike, architectures: list[str] | None = None,
                     extra: dict[str, Any] | None = None) -> None:
        """Write `config.json` in transformers' form (its extra keys included so its loaders are at home).

        extra: further transformers keys a task model needs (id2label, label2id, problem_type).
        """
        data = self.to_dict()
        data.update(model_type="bert", position_embedding_type="absolute", tie_word_embeddings=True)
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
