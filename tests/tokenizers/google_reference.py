"""google-research/bert `tokenization.py`, transcribed for Python 3: the reference for `compat="google"`.

Written from Google's file, not from bertkit: `load_vocab`, `whitespace_tokenize`, `FullTokenizer`,
`BasicTokenizer` (`_clean_text`, `_tokenize_chinese_chars`, lower-casing then `_run_strip_accents` only when
do_lower_case, `_run_split_on_punc`), `WordpieceTokenizer` (greedy longest match first,
max_input_chars_per_word=200) and `_is_whitespace` / `_is_control` / `_is_punctuation`. Only what Python 2 needed
(`six`, `convert_to_unicode` of bytes) and TensorFlow's file reader are left out. Note what it does not do: no NFC
anywhere, and cleaning drops only categories Cc and Cf.

`import_released(folder)` imports Google's released file itself (../shared/ref/google-bert: tokenization.py and its
two stand-ins, six.py and tensorflow/), which `tests/tokenizers/test_google_released.py` runs beside bertkit and
this transcription.

`tokens_with_specials` adds the one thing bertkit does beyond it: a special token written in the text ("[MASK]")
is one piece (Google's scripts insert special tokens as ids; its tokenizer would split "[MASK]" at the brackets).
"""

from __future__ import annotations

import collections
import importlib.util
import sys
import unicodedata
from pathlib import Path

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def import_released(folder: str | Path):
    """google-research/bert's tokenization.py from `folder`, as a module named `google_tokenization`.

    Its stand-ins (`six`, `tensorflow`) are importable only while it is imported: `sys.path` and `sys.modules` are
    put back as they were afterwards (the module keeps its own references), so they shadow nothing else."""
    folder = Path(folder)
    saved = {name: sys.modules.get(name) for name in ("six", "tensorflow")}
    sys.path.insert(0, str(folder))
    try:
        for name in saved:
            sys.modules.pop(name, None)
        spec = importlib.util.spec_from_file_location("google_tokenization", folder / "tokenization.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
        for name, before in saved.items():
            if before is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = before
    return module


def load_vocab(vocab_file) -> "collections.OrderedDict[str, int]":
    """Loads a vocabulary file into a dictionary (each line stripped, as Google's reader does)."""
    vocab = collections.OrderedDict()
    index = 0
    with open(vocab_file, "rb") as reader:  # as tf.io.gfile.GFile reads it: lines end at "\n" only
        while True:
            token = reader.readline().decode("utf-8", "ignore")  # convert_to_unicode
            if not token:
                break
            token = token.strip()
            vocab[token] = index
            index += 1
    return vocab


def whitespace_tokenize(text: str) -> list[str]:
    text = text.strip()
    if not text:
        return []
    return text.split()


class FullTokenizer:
    def __init__(self, vocab, do_lower_case: bool = True) -> None:
        self.vocab = load_vocab(vocab) if not isinstance(vocab, dict) else vocab
        self.basic_tokenizer = BasicTokenizer(do_lower_case=do_lower_case)
        self.wordpiece_tokenizer = WordpieceTokenizer(vocab=self.vocab)

    def tokenize(self, text: str) -> list[str]:
        split_tokens = []
        for token in self.basic_tokenizer.tokenize(text):
            for sub_token in self.wordpiece_tokenizer.tokenize(token):
                split_tokens.append(sub_token)
        return split_tokens

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        return [self.vocab[t] if t in self.vocab else self.vocab["[UNK]"] for t in tokens]


class BasicTokenizer:
    def __init__(self, do_lower_case: bool = True) -> None:
        self.do_lower_case = do_lower_case

    def tokenize(self, text: str) -> list[str]:
        text = self._clean_text(text)
        text = self._tokenize_chinese_chars(text)
        orig_tokens = whitespace_tokenize(text)
        split_tokens = []
        for token in orig_tokens:
            if self.do_lower_case:
                token = token.lower()
                token = self._run_strip_accents(token)
            split_tokens.extend(self._run_split_on_punc(token))
        return whitespace_tokenize(" ".join(split_tokens))

    def _run_strip_accents(self, text: str) -> str:
        text = unicodedata.normalize("NFD", text)
        output = []
        for char in text:
            if unicodedata.category(char) == "Mn":
                continue
            output.append(char)
        return "".join(output)

    def _run_split_on_punc(self, text: str) -> list[str]:
        chars = list(text)
        i = 0
        start_new_word = True
        output: list[list[str]] = []
        while i < len(chars):
            char = chars[i]
            if _is_punctuation(char):
                output.append([char])
                start_new_word = True
            else:
                if start_new_word:
                    output.append([])
                start_new_word = False
                output[-1].append(char)
            i += 1
        return ["".join(x) for x in output]

    def _tokenize_chinese_chars(self, text: str) -> str:
        output = []
        for char in text:
            if self._is_chinese_char(ord(char)):
                output.append(" ")
                output.append(char)
                output.append(" ")
            else:
                output.append(char)
        return "".join(output)

    def _is_chinese_char(self, cp: int) -> bool:
        return ((0x4E00 <= cp <= 0x9FFF) or (0x3400 <= cp <= 0x4DBF) or (0x20000 <= cp <= 0x2A6DF)
                or (0x2A700 <= cp <= 0x2B73F) or (0x2B740 <= cp <= 0x2B81F) or (0x2B820 <= cp <= 0x2CEAF)
                or (0xF900 <= cp <= 0xFAFF) or (0x2F800 <= cp <= 0x2FA1F))

    def _clean_text(self, text: str) -> str:
        output = []
        for char in text:
            cp = ord(char)
            if cp == 0 or cp == 0xFFFD or _is_control(char):
                continue
            if _is_whitespace(char):
                output.append(" ")
            else:
                output.append(char)
        return "".join(output)


class WordpieceTokenizer:
    def __init__(self, vocab, unk_token: str = "[UNK]", max_input_chars_per_word: int = 200) -> None:
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word

    def tokenize(self, text: str) -> list[str]:
        output_tokens = []
        for token in whitespace_tokenize(text):
            chars = list(token)
            if len(chars) > self.max_input_chars_per_word:
                output_tokens.append(self.unk_token)
                continue
            is_bad = False
            start = 0
            sub_tokens = []
            while start < len(chars):
                end = len(chars)
                cur_substr = None
                while start < end:
                    substr = "".join(chars[start:end])
                    if start > 0:
                        substr = "##" + substr
                    if substr in self.vocab:
                        cur_substr = substr
                        break
                    end -= 1
                if cur_substr is None:
                    is_bad = True
                    break
                sub_tokens.append(cur_substr)
                start = end
            if is_bad:
                output_tokens.append(self.unk_token)
            else:
                output_tokens.extend(sub_tokens)
        return output_tokens


def _is_whitespace(char: str) -> bool:
    if char == " " or char == "\t" or char == "\n" or char == "\r":
        return True
    return unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
    if char == "\t" or char == "\n" or char == "\r":
        return False
    return unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char: str) -> bool:
    cp = ord(char)
    if (33 <= cp <= 47) or (58 <= cp <= 64) or (91 <= cp <= 96) or (123 <= cp <= 126):
        return True
    return unicodedata.category(char).startswith("P")


def tokens_with_specials(tokenizer: FullTokenizer, text: str) -> list[str]:
    """`tokenizer.tokenize` of the text between special tokens written in it, each special token one piece."""
    out: list[str] = []
    rest = text
    while rest:
        found = [(rest.find(t), t) for t in SPECIALS if t in rest]
        at, special = min(found) if found else (len(rest), "")
        out.extend(tokenizer.tokenize(rest[:at]))
        if special:
            out.append(special)
        rest = rest[at + len(special):]
    return out
