"""Tokenizers of every kind behind one interface (`base.PieceTokenizer`): WordPiece (BERT), byte-level BPE
(RoBERTa, GPT-2), Unigram (T5, SentencePiece-style) and any transformers tokenizer.json; `load_tokenizer(path)`
reads whichever a directory holds."""

from bertkit.tokenizers.base import Encoding, Frame, PieceTokenizer, truncate_longest_first
from bertkit.tokenizers.bpe import ByteLevelBPETokenizer
from bertkit.tokenizers.load import TOKENIZER_FILES, TOKENIZER_KINDS, detect_tokenizer_kind, load_tokenizer
from bertkit.tokenizers.tokenizer_json import JsonTokenizer
from bertkit.tokenizers.unigram import UnigramTokenizer
from bertkit.tokenizers.word import WordTokenizer
from bertkit.tokenizers.wordpiece import WordPieceTokenizer

__all__ = ["TOKENIZER_FILES", "TOKENIZER_KINDS", "ByteLevelBPETokenizer", "Encoding", "Frame", "JsonTokenizer",
           "PieceTokenizer", "UnigramTokenizer", "WordPieceTokenizer", "WordTokenizer", "detect_tokenizer_kind",
           "load_tokenizer", "truncate_longest_first"]
