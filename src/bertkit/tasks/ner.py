"""Named-entity recognition: CoNLL-2003 reading, tagging-scheme conversion, sub-word label alignment, metrics.

The BERT paper (section 5.3) feeds each word's WordPiece tokens to the encoder and classifies only the FIRST
sub-word of every word; the other sub-words and the special tokens get no label. `align_labels` builds that
target (ignored positions are -100, the loss's ignore index) and `decode_word_predictions` reads per-word
predictions back from the first sub-words. Scoring is entity-level precision/recall/F1 via `seqeval`, in its
default conlleval-compatible mode unless a strict scheme is asked for.

Tag schemes: IOB1 (CoNLL-2003 as distributed: I- everywhere, B- only between two adjacent entities of the same
type), BIO a.k.a. IOB2 (B- on every entity's first word), IOBES (adds E- for last and S- for single-word
entities). Convert IOB1 to BIO before training, as is standard.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

from bertkit.errors import DataError

IGNORE_INDEX = -100  # label of positions the loss must skip (torch.nn.CrossEntropyLoss's default ignore_index)

# A tag is "O" or a one-letter prefix, a dash, and a non-empty entity type.
_TAG = re.compile(r"^(?:O|[BIES]-.+)$")


@dataclass(frozen=True)
class TaggedSentence:
    """One sentence of a CoNLL file: its words and their tags, in order."""

    tokens: list[str]  # words, one per line of the file
    tags: list[str]  # tag of each word, same length as tokens
    line: int  # 1-based line of the sentence's first word


def read_conll(path: str | os.PathLike[str], *, tag_column: int = -1) -> list[TaggedSentence]:
    """Read a CoNLL-2003-style column file.

    The word is the first whitespace-separated column and the tag the column `tag_column` (default: last);
    a blank line ends a sentence; `-DOCSTART-` lines (document boundaries) are skipped.

    Returns:
        Sentences in file order, never empty.
    Raises:
        DataError "{path}:{line}: ..." for a line with fewer than two columns, or whose tag is not "O" or
        "<B|I|E|S>-TYPE" (which usually means the wrong tag column).
    """
    sentences: list[TaggedSentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    start = 0

    def flush() -> None:
        if tokens:
            sentences.append(TaggedSentence(tokens=list(tokens), tags=list(tags), line=start))
            tokens.clear()
            tags.clear()

    with open(path, encoding="utf-8-sig") as f:
        for line_no, line in enumerate(f, start=1):
            fields = line.split()
            if not fields:
                flush()
                continue
            if fields[0] == "-DOCSTART-":
                flush()  # a document boundary also ends any unterminated sentence
                continue
            if len(fields) < 2:
                raise DataError.at(path, line_no, f"expected a token and a tag, found {len(fields)} column(s)")
            try:
                tag = fields[tag_column]
            except IndexError:
                raise DataError.at(path, line_no, f"no column {tag_column} in {len(fields)} columns") from None
            if not _TAG.match(tag):
                raise DataError.at(path, line_no, f"malformed tag {tag!r}; expected O or B-/I-/E-/S-TYPE")
            if not tokens:
                start = line_no
            tokens.append(fields[0])
            tags.append(tag)
    flush()
    return sentences


# ---------------------------------------------------------------------------------------------------------------
# Scheme conversion. All functions take one sentence's tags and return a new list of the same length.


def _split(tag: str) -> tuple[str, str | None]:
    """("B", "PER") for "B-PER"; ("O", None) for "O"."""
    if tag == "O":
        return "O", None
    prefix, _, kind = tag.partition("-")
    if prefix not in "BIES" or len(prefix) != 1 or not kind:
        raise ValueError(f"malformed tag {tag!r}")
    return prefix, kind


def iob1_to_bio(tags: Sequence[str]) -> list[str]:
    """IOB1 → BIO: an I-X that starts an entity (after O or after a different type) becomes B-X."""
    out: list[str] = []
    previous_kind: str | None = None
    for tag in tags:
        prefix, kind = _split(tag)
        if prefix == "I" and kind != previous_kind:
            tag = f"B-{kind}"
        out.append(tag)
        previous_kind = kind
    return out


def bio_to_iobes(tags: Sequence[str]) -> list[str]:
    """BIO → IOBES: entities of one word become S-X, the last word of longer ones E-X.

    An I-X that starts an entity (invalid BIO, but produced by models) is read as B-X, as conlleval does.
    """
    spans = [_split(tag) for tag in tags]
    out: list[str] = []
    for i, (prefix, kind) in enumerate(spans):
        if prefix == "O":
            out.append("O")
            continue
        if prefix not in "BI":
            raise ValueError(f"tag {tags[i]!r} is not BIO")
        begins = prefix == "B" or i == 0 or spans[i - 1][1] != kind
        # The entity continues if the next tag is I- of the same type.
        continues = i + 1 < len(spans) and spans[i + 1] == ("I", kind)
        if begins:
            out.append(f"B-{kind}" if continues else f"S-{kind}")
        else:
            out.append(f"I-{kind}" if continues else f"E-{kind}")
    return out


def iobes_to_bio(tags: Sequence[str]) -> list[str]:
    """IOBES → BIO: S-X → B-X, E-X → I-X; B, I and O unchanged."""
    out: list[str] = []
    for tag in tags:
        prefix, kind = _split(tag)
        out.append({"S": f"B-{kind}", "E": f"I-{kind}"}.get(prefix, tag))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Sub-word alignment.


def align_labels(word_ids: Sequence[int | None], word_labels: Sequence[Hashable],
                 label_to_id: Mapping[Hashable, int]) -> list[int]:
    """Per-token training labels: each word's label id on its first sub-word, -100 everywhere else.

    Args:
        word_ids: for every token of the encoded sequence, the index of the word it came from, or None for
            special tokens ([CLS], [SEP], padding) — what `tokenizers.Encoding.word_ids` returns.
        word_labels: the label (e.g. tag string) of every word of the sentence.
        label_to_id: label → class id.
    Returns:
        A list of len(word_ids) ints: `label_to_id[word_labels[w]]` at the first token of word w (a token whose
        word id differs from the previous token's), IGNORE_INDEX (-100) on continuation sub-words and specials.
        Words cut off by truncation simply do not appear.
    Raises:
        ValueError for a word id outside word_labels or a label missing from label_to_id.
    """
    out: list[int] = []
    previous: int | None = None
    for word in word_ids:
        if word is None or word == previous:
            out.append(IGNORE_INDEX)
        else:
            if not 0 <= word < len(word_labels):
                raise ValueError(f"word id {word} out of range for {len(word_labels)} word labels")
            label = word_labels[word]
            if label not in label_to_id:
                raise ValueError(f"label {label!r} is not in label_to_id")
            out.append(label_to_id[label])
        previous = word
    return out


def decode_word_predictions(word_ids: Sequence[int | None], token_predictions: Sequence,
                            num_words: int | None = None, fill=None) -> list:
    """Per-word predictions read from each word's first sub-word (the inverse of `align_labels`).

    Args:
        word_ids: per-token word index or None, as for `align_labels`.
        token_predictions: one prediction per token (class ids, tag strings, ...), same length as word_ids.
        num_words: number of words in the sentence; defaults to 1 + the largest word id seen. Words that never
            appear (cut off by truncation) get `fill`.
        fill: prediction for words without a token, e.g. "O".
    Returns:
        A list of num_words predictions.
    """
    if len(word_ids) != len(token_predictions):
        raise ValueError(f"{len(word_ids)} word ids for {len(token_predictions)} token predictions")
    seen = [w for w in word_ids if w is not None]
    if num_words is None:
        num_words = max(seen) + 1 if seen else 0
    out = [fill] * num_words
    done = [False] * num_words
    for word, prediction in zip(word_ids, token_predictions):
        if word is None or done[word]:
            continue
        out[word] = prediction
        done[word] = True
    return out


# ---------------------------------------------------------------------------------------------------------------
# Entity-level metrics.


def ner_metrics(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]],
                scheme: str | None = None) -> dict:
    """Entity-level micro precision, recall and F1 (seqeval), plus token accuracy and per-type scores.

    Args:
        true_tags, pred_tags: one list of tags per sentence; sentence lengths must match.
        scheme: None for seqeval's default mode, which reproduces the conlleval script (an I-X after O starts
            an entity). "IOB2"/"BIO", "IOBES", "IOE2", "BILOU", ... switch to seqeval's strict mode, where only
            well-formed chunks of that scheme count as entities.
    Returns:
        {"precision", "recall", "f1", "accuracy": float in [0, 1],
         "per_type": {type: {"precision", "recall", "f1", "support"}}}; scores are 0.0 when undefined
        (no predicted or no gold entities), with no warning.
    """
    import seqeval.metrics
    import seqeval.scheme

    if len(true_tags) != len(pred_tags):
        raise ValueError(f"{len(true_tags)} gold sentences for {len(pred_tags)} predicted sentences")
    for i, (t, p) in enumerate(zip(true_tags, pred_tags)):
        if len(t) != len(p):
            raise ValueError(f"sentence {i}: {len(t)} gold tags for {len(p)} predicted tags")
    y_true = [list(t) for t in true_tags]
    y_pred = [list(p) for p in pred_tags]
    kwargs: dict = {"zero_division": 0}
    if scheme is not None:
        name = {"BIO": "IOB2"}.get(scheme.upper(), scheme.upper())
        if not hasattr(seqeval.scheme, name):
            raise ValueError(f"unknown tagging scheme {scheme!r}")
        kwargs.update(mode="strict", scheme=getattr(seqeval.scheme, name))
    with warnings.catch_warnings():
        # With no entity at all, seqeval's macro/weighted averages take numpy means of empty lists (NaN plus
        # a RuntimeWarning); those rows are dropped below and the micro scores are computed separately.
        warnings.simplefilter("ignore", RuntimeWarning)
        report = seqeval.metrics.classification_report(y_true, y_pred, output_dict=True, **kwargs)
    per_type = {kind: {"precision": float(r["precision"]), "recall": float(r["recall"]),
                       "f1": float(r["f1-score"]), "support": int(r["support"])}
                for kind, r in report.items() if not kind.endswith(" avg")}
    return {
        "precision": float(seqeval.metrics.precision_score(y_true, y_pred, **kwargs)),
        "recall": float(seqeval.metrics.recall_score(y_true, y_pred, **kwargs)),
        "f1": float(seqeval.metrics.f1_score(y_true, y_pred, **kwargs)),
        "accuracy": float(seqeval.metrics.accuracy_score(y_true, y_pred)),
        "per_type": per_type,
    }
