"""bertkit: BERT and its family end to end, from raw text to an evaluated model."""

from bertkit.config import BertConfig
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.modeling import BertForPreTraining, BertModel

__version__ = "0.1.0"
__all__ = ["BertConfig", "WordPieceTokenizer", "BertModel", "BertForPreTraining", "__version__"]
