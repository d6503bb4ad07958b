"""bertkit: BERT and its family end to end, from raw text to an evaluated model."""

from bertkit.tokenizers import ByteLevelBPETokenizer
from bertkit.config import BertConfig
from bertkit.models import (
    BertForCausalLM, BertForMaskedLM, BertForMultipleChoice, BertForPreTraining, BertForQuestionAnswering,
    BertForReplacedTokenDetection, BertForSequenceClassification, BertForTokenClassification, BertModel,
    GeneratorDiscriminator,
)
from bertkit.tokenizers import WordPieceTokenizer

__version__ = "0.1.0"
__all__ = [
    "BertConfig", "WordPieceTokenizer", "ByteLevelBPETokenizer", "BertModel", "BertForPreTraining",
    "BertForMaskedLM", "BertForCausalLM", "BertForReplacedTokenDetection", "GeneratorDiscriminator",
    "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
    "BertForMultipleChoice", "__version__",
]
