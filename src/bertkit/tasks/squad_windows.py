"""SQuAD's sliding windows and the answers read back from them: `make_windows` cuts one example into model inputs,
`postprocess` picks each question's best span from the windows' start/end logits (Google's `run_squad.py`
`convert_examples_to_features` and `write_predictions`), and `google_answer_text` gives a WordPiece model's answer
text as Google's `get_final_text` does. The conventions these follow are listed in `bertkit.tasks.squad`'s
docstring; the reading, the official evaluation and the task family live there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from bertkit.tokenizers.wordpiece import SPECIAL_TOKENS, google_words

# ---------------------------------------------------------------------------------------------------------------
# Windows (features)


@dataclass(frozen=True)
class SquadWindow:
    """One model input cut from one example: `[CLS] question [SEP] passage-slice [SEP]`, padded."""

    qid: str  # question id of the example the window comes from
    window_index: int  # 0, 1, ... within the example
    context: str  # the example's context (shared, not copied), for cutting answer text
    input_ids: list[int]  # (T,) token ids, T = max_seq_length when padded
    token_type_ids: list[int]  # (T,) 0 for [CLS] question [SEP], pair_type_id (BERT 1) from there on, 0 padding
    attention_mask: list[int]  # (T,) 1 for real tokens, 0 for padding
    offsets: list[tuple[int, int] | None]  # (T,) passage tokens: (start, end) characters in context; else None
    token_is_max_context: list[bool]  # (T,) True where a passage token has its most context in this window
    doc_start: int  # index (into the context tokens) of the window's first passage token
    start_position: int | None  # training target: answer start token in the window, 0 = [CLS]; None at inference
    end_position: int | None  # training target: answer end token (inclusive), 0 = [CLS]; None at inference


def char_span_to_token_span(offsets: Sequence[tuple[int, int]], start_char: int,
                            end_char: int) -> tuple[int, int] | None:
    """First and last token (inclusive) overlapping characters [start_char, end_char); None if none overlaps."""
    hits = [i for i, (s, e) in enumerate(offsets) if s < end_char and e > start_char]
    return (hits[0], hits[-1]) if hits else None


def _is_max_context(spans: Sequence[tuple[int, int]], span_index: int, position: int) -> bool:
    """Google's `_check_is_max_context`: is `spans[span_index]` the best window for context token `position`?

    `spans` are (start, length) in context tokens. The score is min(left context, right context) plus a small
    bonus for longer windows; the first window with the highest score wins.
    """
    best_score, best_index = None, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, index
    return best_index == span_index


def make_windows(question_ids: Sequence[int], context_ids: Sequence[int],
                 context_offsets: Sequence[tuple[int, int]], *, qid: str, context: str, cls_id: int, sep_id: int,
                 pad_id: int = 0, max_seq_length: int = 384, doc_stride: int = 128, max_query_length: int = 64,
                 answer: tuple[str, int] | None = None, is_impossible: bool = False,
                 pad_to_max_length: bool = True, pair_separators: int = 1, pair_type_id: int = 1,
                 ) -> list[SquadWindow]:
    """Cut one example into overlapping windows, as Google's `convert_examples_to_features`.

    Args:
        question_ids: the question's token ids without special tokens; cut to `max_query_length` here.
        context_ids: the context's token ids without special tokens, (N,).
        context_offsets: (N,) (start, end) character offsets of each context token in `context`.
        qid, context: the example's id and context string, carried on each window for post-processing.
        cls_id, sep_id, pad_id: special token ids.
        max_seq_length: window length T including [CLS] and two [SEP].
        doc_stride: passage tokens between the starts of consecutive windows.
        answer: for training, the gold (text, answer_start); positions are computed from characters
            [answer_start, answer_start + len(text)). None at inference.
        is_impossible: a SQuAD 2.0 unanswerable training question: every window's target is (0, 0).
        pad_to_max_length: pad every window to exactly `max_seq_length` (else leave it at its real length).
        pair_separators, pair_type_id: the tokenizer's pair framing: separators between question and passage
            (1: BERT's [SEP]; 2: RoBERTa's </s></s>) and the token type from the second on (1 BERT, 0 RoBERTa).
    Returns:
        At least one window (an empty context gives one window with no passage tokens).
    Raises:
        ValueError if the question leaves no room for the passage, if offsets and ids differ in length,
        or if the answer's characters cover no context token.
    """
    if len(context_ids) != len(context_offsets):
        raise ValueError(f"{len(context_ids)} context ids but {len(context_offsets)} offsets")
    question = list(question_ids[:max_query_length])
    # Room left after CLS question SEP(s) ... SEP: 3 specials for BERT, 4 for RoBERTa.
    max_tokens_for_doc = max_seq_length - len(question) - 2 - pair_separators
    if max_tokens_for_doc <= 0:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for the passage after "
                         f"{len(question)} question tokens")
    if doc_stride <= 0:
        raise ValueError(f"doc_stride must be positive, got {doc_stride}")
    # Answer position in context tokens, for training windows.
    token_answer = None if answer is None or is_impossible else _answer_tokens(context_offsets, answer, qid)
    spans = _doc_spans(len(context_ids), max_tokens_for_doc, doc_stride)

    doc_offset = len(question) + 1 + pair_separators  # window position of the first passage token
    windows = []
    for index, (doc_start, length) in enumerate(spans):
        input_ids = [cls_id, *question, *([sep_id] * pair_separators), *context_ids[doc_start:doc_start + length],
                     sep_id]
        # As the tokenizer types a pair: type 0 up to the first separator, pair_type_id from there on.
        token_type_ids = [0] * (len(question) + 2) + [pair_type_id] * (pair_separators - 1 + length + 1)
        offsets: list[tuple[int, int] | None] = [None] * doc_offset
        offsets += [tuple(o) for o in context_offsets[doc_start:doc_start + length]] + [None]
        max_context = [False] * doc_offset
        max_context += [_is_max_context(spans, index, doc_start + i) for i in range(length)] + [False]
        attention_mask = [1] * len(input_ids)
        n_pad = max_seq_length - len(input_ids) if pad_to_max_length else 0
        input_ids += [pad_id] * n_pad
        token_type_ids += [0] * n_pad
        attention_mask += [0] * n_pad
        offsets += [None] * n_pad
        max_context += [False] * n_pad
        start_position, end_position = _window_target(token_answer, is_impossible, doc_start, length, doc_offset)
        windows.append(SquadWindow(qid=qid, window_index=index, context=context, input_ids=input_ids,
                                   token_type_ids=token_type_ids, attention_mask=attention_mask, offsets=offsets,
                                   token_is_max_context=max_context, doc_start=doc_start,
                                   start_position=start_position, end_position=end_position))
    return windows


def _answer_tokens(context_offsets: Sequence[tuple[int, int]], answer: tuple[str, int],
                   qid: str) -> tuple[int, int]:
    """The first and last context token of the gold (text, answer_start); ValueError when it covers none."""
    text, start_char = answer
    token_answer = char_span_to_token_span(context_offsets, start_char, start_char + len(text))
    if token_answer is None:
        raise ValueError(f"question {qid}: answer {text!r} at character {start_char} covers no context token")
    return token_answer


def _doc_spans(n_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) in context tokens of each window: one every doc_stride tokens until one reaches the end of
    the context; [(0, 0)] for an empty context."""
    spans: list[tuple[int, int]] = []
    start = 0
    while start < n_tokens:
        length = min(n_tokens - start, max_tokens_for_doc)
        spans.append((start, length))
        if start + length == n_tokens:
            break
        start += min(length, doc_stride)
    return spans or [(0, 0)]


def _window_target(token_answer: tuple[int, int] | None, is_impossible: bool, doc_start: int, length: int,
                   doc_offset: int) -> tuple[int | None, int | None]:
    """A window's training target (start, end) in window positions: (0, 0), i.e. [CLS], for an unanswerable
    question or an answer not wholly inside the window; (None, None) at inference."""
    if is_impossible:
        return 0, 0
    if token_answer is None:
        return None, None
    first, last = token_answer
    if first >= doc_start and last <= doc_start + length - 1:
        return first - doc_start + doc_offset, last - doc_start + doc_offset
    return 0, 0  # the answer is not wholly inside this window: point at [CLS]


# ---------------------------------------------------------------------------------------------------------------
# Post-processing


def _best_indexes(logits: np.ndarray, n_best_size: int) -> list[int]:
    # Google sorts (index, logit) pairs with Python's stable sort, reverse=True: highest first, equal logits in
    # index order. A stable ascending argsort of the negated logits gives the same order.
    return np.argsort(-logits, kind="stable")[:n_best_size].tolist()


def _softmax(scores: Sequence[float]) -> list[float]:
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def postprocess(windows: Sequence[SquadWindow], start_logits: Sequence[Sequence[float]],
                end_logits: Sequence[Sequence[float]], n_best_size: int = 20, max_answer_length: int = 30,
                version_2: bool = False, null_threshold: float = 0.0,
                answer_text: Callable[[SquadWindow, int, int], str] | None = None,
                ) -> tuple[dict[str, str], dict[str, float], dict[str, list[dict]]]:
    """Best answer span per question from per-window logits, as Google's `write_predictions`.

    For each question, over all its windows: take the `n_best_size` highest start and end logits (over all
    positions, padding included, as Google does); keep pairs whose both ends are passage tokens, start ≤ end,
    length ≤ max_answer_length and whose start token has its max context in that window; rank by
    start_logit + end_logit; drop duplicate texts. With `version_2`, the null answer (score s_null, the minimum
    over windows of start_logit[0] + end_logit[0]) competes too.

    Args:
        windows: windows of any number of examples (from `make_windows`), grouped by `qid` in first-seen order.
        start_logits, end_logits: one (T,) sequence/array per window, aligned with `windows`.
        version_2: SQuAD 2.0 (unanswerable questions allowed).
        null_threshold: answer "" when s_null - best_non_null_score > null_threshold. Use the evaluation's
            `best_f1_thresh` here; `math.inf` always answers with the best span.
        answer_text: (window, first token, last token) -> the answer's text; by default the context's characters
            from the first token's start to the last one's end (offsets). `google_answer_text` gives WordPiece's.
    Returns:
        predictions: qid → answer text (official predictions.json);
        null_odds: qid → s_null - best_non_null_score (official null_odds.json); empty unless version_2;
        nbest: qid → list of {"text", "probability", "start_logit", "end_logit"}, best first (the softmax is
            over this list only), as Google's nbest_predictions.json; a non-empty answer adds "start" and "end",
            the characters of the context its tokens span.
    Where no span is valid (Google would answer the placeholder "empty" in v1 and crash in v2) the answer is "",
    and in v2 null_odds is +inf.
    """
    if not len(windows) == len(start_logits) == len(end_logits):
        raise ValueError(f"{len(windows)} windows, {len(start_logits)} start logits, {len(end_logits)} end logits")
    by_qid: dict[str, list[int]] = {}
    for i, window in enumerate(windows):
        by_qid.setdefault(window.qid, []).append(i)

    predictions: dict[str, str] = {}
    null_odds: dict[str, float] = {}
    nbest_out: dict[str, list[dict]] = {}
    for qid, members in by_qid.items():
        prelim, score_null, null_entry = _candidates(windows, members, start_logits, end_logits, n_best_size,
                                                     max_answer_length, version_2)
        nbest = _nbest(windows, prelim, null_entry, n_best_size, answer_text)
        probs = _softmax([s + e for _, s, e, _ in nbest])
        nbest_out[qid] = [{"text": text, "probability": p, "start_logit": s, "end_logit": e,
                           **({"start": span[0], "end": span[1]} if span else {})}
                          for (text, s, e, span), p in zip(nbest, probs)]
        if not version_2:
            predictions[qid] = nbest[0][0] if nbest else ""
            continue
        best_non_null = next((entry for entry in nbest if entry[0]), None)
        if best_non_null is None:
            null_odds[qid] = math.inf
            predictions[qid] = ""
            continue
        score_diff = score_null - best_non_null[1] - best_non_null[2]
        null_odds[qid] = score_diff
        predictions[qid] = "" if score_diff > null_threshold else best_non_null[0]
    return predictions, null_odds, nbest_out


def _candidates(windows: Sequence[SquadWindow], members: list[int], start_logits: Sequence[Sequence[float]],
                end_logits: Sequence[Sequence[float]], n_best_size: int, max_answer_length: int,
                version_2: bool) -> tuple[list[tuple[int, int, int, float, float]], float, tuple | None]:
    """One question's valid spans over its windows (`members`), best first: (window, start, end, start_logit,
    end_logit); with the null score s_null and its entry (None unless version_2), which is among the spans."""
    prelim = []  # (window, start, end, start_logit, end_logit), in Google's insertion order
    score_null = math.inf
    null_entry = None
    for w in members:
        window = windows[w]
        starts = np.asarray(start_logits[w], dtype=np.float64)
        ends = np.asarray(end_logits[w], dtype=np.float64)
        if version_2:
            null_score = float(starts[0] + ends[0])
            if null_score < score_null:  # strict: the first window with the lowest null score is kept
                score_null, null_entry = null_score, (w, 0, 0, float(starts[0]), float(ends[0]))
        n_tokens = len(window.offsets)
        best_ends = _best_indexes(ends, n_best_size)
        for s in _best_indexes(starts, n_best_size):
            for e in best_ends:
                if s >= n_tokens or e >= n_tokens:
                    continue
                if window.offsets[s] is None or window.offsets[e] is None:
                    continue  # not a passage token: question, special or padding
                if not window.token_is_max_context[s]:
                    continue
                if e < s or e - s + 1 > max_answer_length:
                    continue
                prelim.append((w, s, e, float(starts[s]), float(ends[e])))
    if null_entry is not None:
        prelim.append(null_entry)
    prelim.sort(key=lambda p: p[3] + p[4], reverse=True)
    return prelim, score_null, null_entry


def _nbest(windows: Sequence[SquadWindow], prelim: list[tuple[int, int, int, float, float]], null_entry,
           n_best_size: int, answer_text: Callable[[SquadWindow, int, int], str] | None,
           ) -> list[tuple[str, float, float, tuple[int, int] | None]]:
    """The n-best answers (text, start_logit, end_logit, characters of the context or None), distinct texts in
    the order of `prelim`; the null answer is always among them when there is one (`null_entry`)."""
    seen: set[str] = set()
    nbest: list[tuple[str, float, float, tuple | None]] = []
    for w, s, e, start_logit, end_logit in prelim:
        if len(nbest) >= n_best_size:
            break
        span = None
        if s > 0:
            window = windows[w]
            span = (window.offsets[s][0], window.offsets[e][1])
            text = (answer_text(window, s, e) if answer_text is not None else window.context[span[0]:span[1]])
            if text in seen:
                continue
        else:
            text = ""
        seen.add(text)
        nbest.append((text, start_logit, end_logit, span))
    if "" not in seen and null_entry is not None:
        nbest.append(("", null_entry[3], null_entry[4], None))  # the null answer always appears in the n-best
    return nbest


# ---------------------------------------------------------------------------------------------------------------
# Answer text of WordPiece models: Google's get_final_text


def _is_google_whitespace(char: str) -> bool:
    # run_squad.py's reader splits the paragraph on these only (not on every Unicode space).
    return char in " \t\r\n" or ord(char) == 0x202F


def whitespace_words(context: str) -> tuple[list[str], list[int]]:
    """run_squad.py's `doc_tokens` and `char_to_word_offset`: the context's whitespace-separated words, and for
    every character the index of the word it is in (a space: the word before it, -1 before the first)."""
    words: list[str] = []
    char_to_word: list[int] = []
    previous_space = True
    for char in context:
        if _is_google_whitespace(char):
            previous_space = True
        else:
            if previous_space:
                words.append(char)
            else:
                words[-1] += char
            previous_space = False
        char_to_word.append(len(words) - 1)
    return words, char_to_word


def basic_tokenize(text: str, lowercase: bool = True, strip_accents: bool | None = None) -> list[str]:
    """Google's `BasicTokenizer.tokenize`: clean the text, space out CJK characters, split on whitespace, lower-case
    and strip accents (strip_accents None: as lowercase), split off punctuation. What get_final_text aligns: the
    words of `bertkit.tokenizers.wordpiece.google_words` under Google's rules, a special token written in the text
    ("[MASK]") split as Google's tokenizer splits it (its brackets are punctuation)."""
    words: list[str] = []
    for word, _ in google_words(text, lowercase, strip_accents, compat="google"):
        inner = word[1:-1].lower() if lowercase else word[1:-1]
        words += ["[", inner, "]"] if word in SPECIAL_TOKENS else [word]
    return words


def get_final_text(pred_text: str, orig_text: str, lowercase: bool = True, strip_accents: bool | None = None) -> str:
    """Google's `get_final_text`: project the normalised prediction `pred_text` (pieces joined, "##" removed) back
    onto `orig_text` (the whitespace words it came from). Both are aligned character by character without spaces
    after basic tokenisation; where that fails (the normalised text is not found, or has another length, as after
    [UNK] or characters that normalise to several), the whole `orig_text` is the answer."""

    def strip_spaces(text: str) -> tuple[str, dict[int, int]]:
        kept = [(i, c) for i, c in enumerate(text) if c != " "]
        return "".join(c for _, c in kept), {n: i for n, (i, _) in enumerate(kept)}

    tok_text = " ".join(basic_tokenize(orig_text, lowercase, strip_accents))
    start = tok_text.find(pred_text)
    if start == -1:
        return orig_text
    end = start + len(pred_text) - 1
    orig_ns_text, orig_ns_to_s = strip_spaces(orig_text)
    tok_ns_text, tok_ns_to_s = strip_spaces(tok_text)
    if len(orig_ns_text) != len(tok_ns_text):
        return orig_text
    tok_s_to_ns = {s: n for n, s in tok_ns_to_s.items()}
    if start not in tok_s_to_ns or tok_s_to_ns[start] not in orig_ns_to_s:
        return orig_text
    if end not in tok_s_to_ns or tok_s_to_ns[end] not in orig_ns_to_s:
        return orig_text
    return orig_text[orig_ns_to_s[tok_s_to_ns[start]]:orig_ns_to_s[tok_s_to_ns[end]] + 1]


def google_answer_text(id_to_token: Callable[[int], str], lowercase: bool = True,
                       strip_accents: bool | None = None) -> Callable[[SquadWindow, int, int], str]:
    """`postprocess`'s answer_text for WordPiece windows, as run_squad.py's write_predictions: the span's pieces
    (id_to_token) joined without "##", and the context's whitespace words they come from, through
    `get_final_text`. Each piece's word is the one its first character's offset falls in."""
    cache: dict[str, tuple[list[str], list[int]]] = {}

    def text(window: SquadWindow, first: int, last: int) -> str:
        if window.context not in cache:
            cache.clear()  # windows come grouped by example: one context at a time is enough
            cache[window.context] = whitespace_words(window.context)
        words, char_to_word = cache[window.context]
        pieces = " ".join(id_to_token(i) for i in window.input_ids[first:last + 1])
        pred_text = " ".join(pieces.replace(" ##", "").replace("##", "").strip().split())
        orig = words[char_to_word[window.offsets[first][0]]:char_to_word[window.offsets[last][0]] + 1]
        return get_final_text(pred_text, " ".join(orig), lowercase, strip_accents)

    return text


def answer_text_for(tokenizer) -> Callable[[SquadWindow, int, int], str] | None:
    """How a tokenizer's spans become answer text: Google's get_final_text for WordPiece, else None (offsets)."""
    if tokenizer.kind != "wordpiece":
        return None
    return google_answer_text(tokenizer.id_to_token, getattr(tokenizer, "lowercase", True),
                              getattr(tokenizer, "strip_accents", None))
