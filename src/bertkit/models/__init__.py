"""Every architecture bertkit builds, one file each, sharing the attention layouts (`layouts.py`) and the kernel
choices (`kernels.py`): `bert.py` (BERT, RoBERTa, ALBERT, ELECTRA, DistilBERT, causal: one set of classes),
`heads.py` (the task models), `modernbert.py`, `t5.py`, `xlnet.py`, `elmo.py`; `registry.py` is the architecture
table that says which class serves which use.

The model files load torch, so they are imported on first use (PEP 562): `bertkit.models.registry` and the task
families that read it stay free of torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from bertkit.config import IGNORE_INDEX
from bertkit.models.registry import ARCHITECTURES, ROLE_NAMES, architecture_of

# Public name -> the file that defines it.
_LAZY: dict[str, str] = {name: module for module, names in {
    "bert": ("BertForCausalLM", "BertForMaskedLM", "BertForPreTraining", "BertForReplacedTokenDetection", "BertModel",
             "BertOutput", "ElectraOutput", "GeneratorDiscriminator", "PreTrainedModel", "PreTrainingOutput",
             "TaskOutput", "check_inputs", "compile_layers", "generator_config_for", "set_fast_paths"),
    "elmo": ("ElmoLanguageModel", "ElmoModel", "ElmoOutput"),
    "heads": ("BertForMultipleChoice", "BertForQuestionAnswering", "BertForSequenceClassification",
              "BertForTokenClassification"),
    "kernels": ("Linear", "linear"),
    "layouts": ("Encoded", "Padded", "Unpadded"),
    "modeldir": ("ModelDir", "model_class"),
    "modernbert": ("ModernBertForMaskedLM", "ModernBertForMultipleChoice", "ModernBertForQuestionAnswering",
                   "ModernBertForSequenceClassification", "ModernBertForTokenClassification", "ModernBertModel"),
    "pooling": ("SentenceEncoder",),
    "t5": ("DecoderCache", "Seq2SeqOutput", "T5EncoderModel", "T5EncoderOutput", "T5ForConditionalGeneration"),
    "xlnet": ("XLNetForMultipleChoice", "XLNetForQuestionAnswering", "XLNetForSequenceClassification",
              "XLNetForTokenClassification", "XLNetLMHeadModel", "XLNetModel"),
}.items() for name in names}

__all__ = sorted({*_LAZY, "IGNORE_INDEX", "ROLE_CLASSES", "ROLE_NAMES", "class_for", "pretraining_class"} - {"SentenceEncoder"})


def _role_classes() -> dict[str, dict[str, type]]:
    """architecture (a row's name: model_type, or "causal") -> {role: model class}, from the architecture table."""
    return {row.name: {role: __getattr__(name) for role, name in row.roles.items()} for row in ARCHITECTURES.values()}


def __getattr__(name: str) -> Any:
    if name == "ROLE_CLASSES":
        # The class each role loads a model directory as, by its architecture (registry.architecture_of: the
        # model_type, or "causal"): derived once from bertkit.models.registry (a dict, so a test may take a role
        # away with monkeypatch.setitem).
        value = _role_classes()
    elif name in _LAZY:
        value = getattr(importlib.import_module(f"bertkit.models.{_LAZY[name]}"), name)
    else:
        raise AttributeError(f"module 'bertkit.models' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def class_for(config, role: str, what: str = "") -> type:
    """The model class of `role` (a ROLE_NAMES key) for a model of `config` (any config class).

    Raises ValueError naming the model type and the role when bertkit has no such model for that architecture
    (`what`: the directory or verb, for the message)."""
    row = (globals().get("ROLE_CLASSES") or __getattr__("ROLE_CLASSES")).get(architecture_of(config).name, {})
    if role not in row:
        where = f" ({what})" if what else ""
        raise ValueError(f"bertkit has no {ROLE_NAMES.get(role, role)} model for model_type "
                         f"{config.model_type!r}{where}")
    return row[role]


def pretraining_class(config) -> type:
    """The class a model of `config` pretrains as: its architecture row's pretraining role (BertForCausalLM for a
    causal BERT-family config, T5's encoder-decoder, BertForPreTraining, ModernBERT's masked LM, ...)."""
    row = architecture_of(config)
    return __getattr__(row.roles[row.pretraining_role])

