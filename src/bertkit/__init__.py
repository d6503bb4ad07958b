"""bertkit: BERT and its family end to end, from raw text to an evaluated model."""

from typing import TYPE_CHECKING

from bertkit.config import BertConfig
from bertkit.tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer

if TYPE_CHECKING:
    from bertkit.models import (
        BertForCausalLM, BertForMaskedLM, BertForMultipleChoice, BertForPreTraining, BertForQuestionAnswering,
        BertForReplacedTokenDetection, BertForSequenceClassification, BertForTokenClassification, BertModel,
        GeneratorDiscriminator,
    )

__version__ = "0.1.0"
__all__ = [
    "BertConfig", "WordPieceTokenizer", "ByteLevelBPETokenizer", "BertModel", "BertForPreTraining",
    "BertForMaskedLM", "BertForCausalLM", "BertForReplacedTokenDetection", "GeneratorDiscriminator",
    "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
    "BertForMultipleChoice", "__version__",
]
# The models load torch, so they are imported on first use (PEP 562): the task readers, metrics and tokenizers
# (`import bertkit.tasks.glue`) stay free of it.
_MODELS = frozenset(__all__) - {"BertConfig", "WordPieceTokenizer", "ByteLevelBPETokenizer", "__version__"}


def __getattr__(name: str):
    if name in _MODELS:
        import bertkit.models

        value = getattr(bertkit.models, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bertkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
