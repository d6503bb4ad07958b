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

from typing import Any

from bertkit.config.architectures import (ELMO_PRESETS, MODERNBERT_POOLING, MODERNBERT_PRESETS, T5_PRESETS,
                                          XLNET_PRESETS, XLNET_SUMMARY_ACTIVATIONS, XLNET_SUMMARY_TYPES, ElmoConfig,
                                          ModernBertConfig, T5Config, XLNetConfig)
from bertkit.config.base import (ACTIVATIONS, CONFIG_NAME, IGNORE_INDEX, MAX_SIZE, ConfigFile, check_choice,
                                 check_fields, check_finite, check_token_ids, field_with_help, with_article)
from bertkit.config.bert import FAMILIES, PRESETS, BertConfig, Family

__all__ = ["ACTIVATIONS", "CONFIG_NAME", "ELMO_PRESETS", "FAMILIES", "IGNORE_INDEX", "MAX_SIZE", "MODERNBERT_POOLING",
           "MODERNBERT_PRESETS", "PRESETS", "T5_PRESETS", "XLNET_PRESETS", "XLNET_SUMMARY_ACTIVATIONS",
           "XLNET_SUMMARY_TYPES", "BertConfig", "ConfigFile", "ElmoConfig", "Family", "ModernBertConfig", "T5Config",
           "XLNetConfig", "check_choice", "check_fields", "check_finite", "check_token_ids", "config_class_for",
           "config_from_dict", "field_with_help", "label_of", "presets_for", "with_article"]


def config_class_for(model_type: str | None) -> type:
    """The config dataclass of a `model_type`: the config class that names it as its own (`model_type`, or for
    BertConfig any key of FAMILIES); BertConfig for None and for a model_type no class knows (whose from_dict then
    refuses it, naming the model_types bertkit reads)."""
    for cls in ConfigFile.__subclasses__():
        if model_type in cls.model_types():
            return cls
    return BertConfig


def label_of(model_type: str | None) -> str:
    """How messages and the docs name a model of `model_type` ("RoBERTa", "T5"): the one display label of each
    architecture (`ConfigFile.label_of`); the model_type itself for one bertkit does not read."""
    cls = config_class_for(model_type)
    return cls.label_of(model_type or "bert") if (model_type or "bert") in cls.model_types() else str(model_type)


def presets_for(model_type: str | None) -> dict[str, tuple]:
    """The size presets `config_class_for(model_type).preset` knows."""
    return config_class_for(model_type).PRESETS


def config_from_dict(raw: dict[str, Any], source: str = "config") -> Any:
    """A config.json dict as the config class of its `model_type` (BertConfig for the BERT family)."""
    return config_class_for(raw.get("model_type") or "bert").from_dict(raw, source=source)
