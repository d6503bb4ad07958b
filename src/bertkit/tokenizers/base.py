"""What every tokenizer kind shares: the `Encoding` it returns, BERT's longest-first pair rule, and
`PieceTokenizer`, the special-token framing (`CLS A SEP [SEP] B SEP`) built in Python so the rule is visible.

The kinds (`wordpiece.py`, `bpe.py`, ...) bring their vocabulary and their engine from the `tokenizers` library;
`load.py` tells which kind a directory holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass
class Encoding:
    """One encoded text or text pair.

    All lists have the same length T (the number of tokens, special tokens included).
    `offsets[i]` is the (start, end) character span of token i in its own text ((0, 0) for special tokens);
    `sequence_ids[i]` says which text that is (0 = first, 1 = pair, None = special);
    `word_ids[i]` is the index of the word token i belongs to within its text (None for special tokens).
    """

    input_ids: list[int]
    token_type_ids: list[int]
    attention_mask: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]
    sequence_ids: list[int | None]
    special_tokens_mask: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)


def truncate_longest_first(a: list, b: list | None, max_tokens: int) -> tuple[list, list | None, int, int]:
    """Cut the ends of `a` and `b` until len(a) + len(b) <= max_tokens, always from the longer one (ties: from b).

    Returns the kept parts and how many items were kept of each. This is BERT's pair rule: it keeps as much of
    the shorter text as possible.
    """
    if b is None:
        keep_a = min(len(a), max(max_tokens, 0))
        return a[:keep_a], None, keep_a, 0
    keep_a, keep_b = len(a), len(b)
    excess = keep_a + keep_b - max(max_tokens, 0)
    if excess > 0:
        # First remove from the longer one until both are equal, then alternate, b first on ties.
        gap = min(excess, abs(keep_a - keep_b))
        if keep_a > keep_b:
            keep_a -= gap
        else:
            keep_b -= gap
        excess -= gap
        keep_b -= (excess + 1) // 2
        keep_a -= excess // 2
    return a[:keep_a], b[:keep_b], keep_a, keep_b


class PieceTokenizer:
    """What WordPiece and byte-level BPE share: vocabulary lookups, and the special-token framing of the engine's
    pieces, `CLS A SEP` or `CLS A SEP [SEP] B SEP`, built here in Python so the rule is visible.

    A subclass sets `_vocab`, `_id_to_token`, `backend`, `cls_id`, `sep_id`, `pad_id`, `special_ids`, the three
    framing tokens' strings, how many separators stand between a pair's texts, the pair text's token type, and
    `_truncate` (its pair rule); `encode_raw` gives the engine's encodings of whole texts.
    """

    cls_token = sep_token = pad_token = ""
    pair_separators = 1  # [SEP] between A and B; RoBERTa's "</s></s>" is 2
    pair_type_id = 1  # token type of B and its closing separator; RoBERTa has one type, 0

    # ---- vocabulary ------------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def __len__(self) -> int:
        return len(self._vocab)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    def id_to_token(self, index: int) -> str:
        return self._id_to_token[index]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self._id_to_token[int(i)] for i in ids]

    # ---- encoding --------------------------------------------------------------------------------------------
    def encode_raw(self, texts: Sequence[str]):
        """The engine's encodings of whole texts, without special tokens."""
        raise NotImplementedError

    def encode_plain(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids without special tokens for many texts at once (parallel in the engine); for corpus preparation."""
        return [e.ids for e in self.encode_raw(texts)]

    def _truncate(self, n_a: int, n_b: int | None, budget: int) -> tuple[int, int]:
        """How many pieces of a (and b) to keep within `budget` tokens."""
        raise NotImplementedError

    def encode(self, text: str, pair: str | None = None, max_length: int | None = None, truncation: bool = True,
               padding: bool | str = False) -> Encoding:
        """Encode a text (or a pair) with its special tokens.

        max_length: the longest output, special tokens included. With `truncation`, the pieces are cut
        longest-first to fit; without it a longer input raises ValueError.
        padding: False; True or "max_length" pads up to `max_length` (attention_mask 0 there).
        """
        return self.encode_batch([text], None if pair is None else [pair], max_length, truncation, padding)[0]

    def encode_batch(self, texts: Sequence[str], pairs: Sequence[str] | None = None, max_length: int | None = None,
                     truncation: bool = True, padding: bool | str = False) -> list[Encoding]:
        """`encode` for many texts; padding=True pads to the longest in the batch (or to max_length if set)."""
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}] is {type(t).__name__}, not str")
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
        firsts = self.encode_raw(texts)
        seconds = self.encode_raw(list(pairs)) if pairs is not None else None
        out = [self._build(firsts[i], None if seconds is None else seconds[i], max_length, truncation)
               for i in range(len(texts))]
        if padding:
            target = max_length if (padding == "max_length" or max_length) and max_length else max(map(len, out))
            for enc in out:
                self._pad(enc, target)
        return out

    def _build(self, a, b, max_length: int | None, truncation: bool) -> Encoding:
        specials = 2 if b is None else 1 + self.pair_separators + 1
        n_a, n_b = len(a.ids), (0 if b is None else len(b.ids))
        if max_length is not None and n_a + n_b + specials > max_length:
            if not truncation:
                raise ValueError(f"input of {n_a + n_b + specials} tokens is longer than max_length {max_length} "
                                 f"and truncation is off")
            n_a, n_b = self._truncate(n_a, None if b is None else n_b, max_length - specials)
        ids = [self.cls_id, *a.ids[:n_a], self.sep_id]
        tokens = [self.cls_token, *a.tokens[:n_a], self.sep_token]
        offsets = [(0, 0), *a.offsets[:n_a], (0, 0)]
        word_ids = [None, *a.word_ids[:n_a], None]
        seq_ids: list[int | None] = [None, *([0] * n_a), None]
        types = [0] * (n_a + 2)
        if b is not None:
            extra = self.pair_separators - 1  # separators after A's closing one
            ids += [*([self.sep_id] * extra), *b.ids[:n_b], self.sep_id]
            tokens += [*([self.sep_token] * extra), *b.tokens[:n_b], self.sep_token]
            offsets += [*([(0, 0)] * extra), *b.offsets[:n_b], (0, 0)]
            word_ids += [*([None] * extra), *b.word_ids[:n_b], None]
            seq_ids += [*([None] * extra), *([1] * n_b), None]
            types += [self.pair_type_id] * (extra + n_b + 1)
        special = [1 if s is None else 0 for s in seq_ids]
        return Encoding(ids, types, [1] * len(ids), tokens, offsets, word_ids, seq_ids, special)

    def _pad(self, enc: Encoding, length: int) -> None:
        extra = length - len(enc.input_ids)
        if extra <= 0:
            return
        enc.input_ids += [self.pad_id] * extra
        enc.token_type_ids += [0] * extra
        enc.attention_mask += [0] * extra
        enc.tokens += [self.pad_token] * extra
        enc.offsets += [(0, 0)] * extra
        enc.word_ids += [None] * extra
        enc.sequence_ids += [None] * extra
        enc.special_tokens_mask += [1] * extra
