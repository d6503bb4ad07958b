"""Tokenizers of every kind behind one interface (`base.PieceTokenizer`): WordPiece (BERT), byte-level BPE
(RoBERTa, GPT-2); `load_tokenizer(path)` reads whichever a directory holds."""

from bertkit.tokenizers.base import Encoding, PieceTokenizer, truncate_longest_first
from bertkit.tokenizers.bpe import ByteLevelBPETokenizer
from bertkit.tokenizers.load import TOKENIZER_KINDS, detect_tokenizer_kind, load_tokenizer
from bertkit.tokenizers.wordpiece import WordPieceTokenizer

__all__ = ["TOKENIZER_KINDS", "ByteLevelBPETokenizer", "Encoding", "PieceTokenizer", "WordPieceTokenizer",
           "detect_tokenizer_kind", "load_tokenizer", "truncate_longest_first"]
