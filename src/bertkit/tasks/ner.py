"""Named-entity recognition: CoNLL-2003 reading, tagging schemes, sub-word label alignment, metrics, and
`TaggingFamily`, the fine-tuning kind "ner" (features, loss, evaluation, predictions, the CoNLL predictions file).

The BERT paper (section 5.3) feeds each word's WordPiece tokens to the encoder and classifies only the FIRST
sub-word of every word; the other sub-words and the special tokens get no label. `align_labels` builds that
target (ignored positions are -100, the loss's ignore index) and `decode_word_predictions` reads per-word
predictions back from the first sub-words. Scoring is entity-level precision/recall/F1 via `seqeval`, in its
default conlleval-compatible mode unless a strict scheme is asked for.

Tag schemes: IOB1 (CoNLL-2003 as distributed: I- everywhere, B- only between two adjacent entities of the same
type), BIO a.k.a. IOB2 (B- on every entity's first word), IOBES (adds E- for last and S- for single-word
entities). Convert IOB1 to BIO before training, as is standard.

Plain tag sets (part of speech, chunks: CoNLL-2003's other columns) are tagged the same way with scheme "none"
(`--column 1 --scheme none`): every tag is a label of its own, nothing is converted, and the score is token
accuracy (`tag_accuracy`). A column of IOB tags (the chunks, column 2) can also be read as spans with the default
scheme, scored by chunk F1 as CoNLL-2000.

Besides CoNLL column files, `read_tagged_table` reads sentences from tables (Parquet, Arrow, `datasets`
directories, JSON Lines, JSON records: `bertkit.data.readers`) with a list of words and a list of tags per row, the
tags strings or integers named by the column's ClassLabel names (conll2003's layout on the Hub); the same
sentences give the same run either way.

Inputs are `CLS pieces-of-the-words SEP` with the tokenizer's own special tokens (`[CLS] ... [SEP]` for BERT,
`<s> ... </s>` for RoBERTa), one token type; the words are given (CoNLL tokens), so every kind of tokenizer pieces
each word on its own (`encode_words`) and says which word each piece came from.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from bertkit.config import IGNORE_INDEX  # label of positions the loss skips (torch's cross-entropy default)
from bertkit.data.readers import MISSING, Row, Table, field, table_or_own_format
from bertkit.errors import DataError
from bertkit.tasks.base import TaskFamily, check_count, cut_at, json_text, register, softmax, utf8_errors

# A tag is "O" or a one-letter prefix, a dash, and a non-empty entity type.
_TAG = re.compile(r"^(?:O|[BIES]-.+)$")


@dataclass(frozen=True)
class TaggedSentence:
    """One sentence of a CoNLL file: its words and their tags, in order."""

    tokens: list[str]  # words, one per line of the file
    tags: list[str]  # tag of each word, same length as tokens
    line: int  # 1-based line of the sentence's first word


def read_conll(path: str | os.PathLike[str], *, tag_column: int = -1, plain: bool = False) -> list[TaggedSentence]:
    """Read a CoNLL-2003-style column file.

    The word is the first whitespace-separated column and the tag the column `tag_column` (default: last);
    a blank line ends a sentence; `-DOCSTART-` lines (document boundaries) are skipped. plain: the tags are a
    plain tag set (POS, ...), taken as they are; otherwise each must be an entity tag.

    Returns:
        Sentences in file order, never empty.
    Raises:
        DataError "{path}:{line}: ..." for a line with fewer than two columns, without column `tag_column`, or
        (unless plain) whose tag is not "O" or "<B|I|E|S>-TYPE" (which usually means the wrong tag column).
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

    with open(path, encoding="utf-8-sig") as f, utf8_errors(path):
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
            if not plain and not _TAG.match(tag):
                raise DataError.at(path, line_no, f"malformed tag {tag!r}; expected O or B-/I-/E-/S-TYPE (plain "
                                                  f"tags such as POS: --scheme none)")
            if not tokens:
                start = line_no
            tokens.append(fields[0])
            tags.append(tag)
    flush()
    return sentences


def table_format_of(path: str | os.PathLike[str], format: str | None = None) -> str | None:
    """The table format a NER file is read in, or None for CoNLL columns: `format` when given ("conll": None);
    by path, JSON (Lines), Parquet, Arrow and `datasets` directories are tables, anything else is CoNLL (its files
    are .txt, .conll or have no suffix at all)."""
    return table_or_own_format(path, format, "conll", ("tsv", "csv"))


def read_tagged_table(path: str | os.PathLike[str], tokens_column: str = "tokens", tags_column: str = "ner_tags", *,
                      format: str | None = None, records: str | None = None,
                      plain: bool = False) -> list[TaggedSentence]:
    """Sentences from a table with a list of words and a list of tags per row (conll2003's layout on the Hub).

    Tags are strings, or integers named by the tags column's ClassLabel names (`datasets` features: the
    dataset_info.json of a save_to_disk directory, the schema metadata of its Parquet and Arrow files). Each
    sentence's `line` is its row (`bertkit.data.readers.Row`) or its JSONL line. Raises DataError naming the file,
    the row and the column for a missing column (with the columns there are), a null or non-list cell, a word that
    is no string, lists of different lengths, an integer tag without ClassLabel names or outside them, and (unless
    plain) a tag that is not "O" or "<B|I|E|S>-TYPE"."""
    table = Table(path, format, records)
    table.require(tokens_column, tags_column)
    names = table.class_names(tags_column)
    sentences = []
    for where, record in table.rows([tokens_column, tags_column]):
        cells = []
        for column, what in ((tokens_column, "tokens"), (tags_column, "tags")):
            value = field(record, column)
            if value is MISSING:
                raise DataError.at(path, where, f"no {what} column {column!r}; the record has {sorted(record)}")
            if not isinstance(value, list):
                raise DataError.at(path, where, f"the {what} column {column!r} must be a list, got "
                                                f"{'null' if value is None else type(value).__name__}")
            cells.append(value)
        tokens, raw_tags = cells
        if len(tokens) != len(raw_tags):
            raise DataError.at(path, where, f"{len(tokens)} tokens ({tokens_column!r}) but {len(raw_tags)} tags "
                                            f"({tags_column!r})")
        if not tokens:
            continue  # an empty row, as a blank line in CoNLL
        tags = []
        for word, tag in zip(tokens, raw_tags):
            if not isinstance(word, str):
                raise DataError.at(path, where, f"the tokens column {tokens_column!r} holds "
                                                f"{'null' if word is None else type(word).__name__}, not a string")
            if isinstance(tag, int) and not isinstance(tag, bool):
                if names is None:
                    raise DataError.at(path, where, f"integer tags in {tags_column!r} but the file names no "
                                                    f"ClassLabel for them (datasets features); write the tags as "
                                                    f"strings")
                if not 0 <= tag < len(names):
                    raise DataError.at(path, where, f"tag {tag} is outside the {len(names)} ClassLabel names of "
                                                    f"{tags_column!r}")
                tag = names[tag]
            elif not isinstance(tag, str):
                raise DataError.at(path, where, f"the tags column {tags_column!r} holds "
                                                f"{'null' if tag is None else type(tag).__name__}, not a string "
                                                f"or an integer")
            if not plain and not _TAG.match(tag):
                raise DataError.at(path, where, f"malformed tag {tag!r}; expected O or B-/I-/E-/S-TYPE (plain tags "
                                                f"such as POS: --scheme none)")
            tags.append(tag)
        sentences.append(TaggedSentence(tokens=list(tokens), tags=tags, line=where))
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

    _check_alignment(true_tags, pred_tags)
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


def _check_alignment(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]]) -> None:
    """ValueError unless both have as many sentences, and each sentence as many tags."""
    if len(true_tags) != len(pred_tags):
        raise ValueError(f"{len(true_tags)} gold sentences for {len(pred_tags)} predicted sentences")
    for i, (t, p) in enumerate(zip(true_tags, pred_tags)):
        if len(t) != len(p):
            raise ValueError(f"sentence {i}: {len(t)} gold tags for {len(p)} predicted tags")


def tag_accuracy(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]]) -> dict:
    """Token accuracy of plain tags (POS, chunks as tags): {"accuracy": correct words / words, "tokens": words};
    sentence lengths must match."""
    _check_alignment(true_tags, pred_tags)
    correct = total = 0
    for t, p in zip(true_tags, pred_tags):
        correct += sum(a == b for a, b in zip(t, p))
        total += len(t)
    return {"accuracy": correct / total if total else 0.0, "tokens": total}


# ---------------------------------------------------------------------------------------------------------------
# Words, features and entity spans.

_WORD = re.compile(r"\w+(?:[-'’.]\w+)*|[^\w\s]")  # words (with inner hyphens, apostrophes, dots) and punctuation


def split_words(text: str) -> list[tuple[str, int, int]]:
    """(word, start, end) of every word and punctuation mark of `text`, the way CoNLL files split sentences."""
    return [(m.group(), m.start(), m.end()) for m in _WORD.finditer(text)]


def encode_words(tokenizer, sentences: Sequence[Sequence[str]], max_length: int) -> list[dict[str, Any]]:
    """`CLS pieces of the words SEP` (the tokenizer's own special tokens), truncated to max_length, one token type,
    with each token's word index (None: special).

    Words are the sentence's given words (CoNLL tokens): any tokenizer kind still splits each into pieces (BERT's
    also on punctuation), and `word_ids` says which given word each piece came from.
    """
    encoded = tokenizer.encode_words([list(s) for s in sentences])
    out = []
    for enc in encoded:
        n = min(len(enc.ids), max_length - 2)
        out.append({"input_ids": [tokenizer.cls_id, *enc.ids[:n], tokenizer.sep_id],
                    "token_type_ids": [0] * (n + 2),
                    "word_ids": [None, *enc.word_ids[:n], None]})
    return out


def tags_to_spans(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """Entities of a tag sequence as (type, first word, last word + 1); conlleval's reading of BIO/IOB1/IOBES."""
    spans: list[tuple[str, int, int]] = []
    kind, start = None, 0
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, this = tag.partition("-")
        begins = prefix in ("B", "S") or (prefix in ("I", "E") and this != kind)
        if kind is not None and (prefix == "O" or begins):
            spans.append((kind, start, i))
            kind = None
        if prefix != "O" and (begins or kind is None):
            kind, start = this, i
        if prefix in ("E", "S") and kind is not None:
            spans.append((kind, start, i + 1))
            kind = None
    return spans


# ---------------------------------------------------------------------------------------------------------------
# The loss and the family.


class TokenClassificationTask:
    """Trainer task: cross-entropy on labelled tokens only (each word's first sub-word; IGNORE_INDEX elsewhere)."""

    name = "ner"

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        return {"ner_loss": float((batch["labels"] != IGNORE_INDEX).sum())}

    def __call__(self, model, batch):
        import torch.nn.functional as F  # torch only when a model trains: reading needs none

        # torch-free module: only the loss needs torch
        from bertkit.models.layouts import host_count, mark_host, positions

        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits.float()
        labels = batch["labels"]
        # the labelled positions from the host copy of the labels: indexing them reads nothing from the device
        at = positions(mark_host(labels != IGNORE_INDEX, labels, lambda y: y != IGNORE_INDEX))
        n = host_count(at.numel(), logits.device)
        scores = logits.reshape(-1, logits.shape[-1]).index_select(0, at)  # (N, num_labels)
        gold = labels.reshape(-1).index_select(0, at)  # (N,)
        return {"ner_loss": (F.cross_entropy(scores, gold, reduction="sum"), n),
                "ner_accuracy": ((scores.argmax(-1) == gold).sum().float(), n)}


@register("ner")
class TaggingFamily(TaskFamily):
    """CoNLL-style named-entity recognition: tags on each word's first sub-word (paper section 5.3).

    IOB1 files (CoNLL-2003 as distributed) are converted to BIO; the labels are "O" then B-/I- (IOBES files:
    B-/I-/E-/S-) of every entity type of the training file. A sentence longer than max_seq_length is cut: its
    last words get no training label and are predicted "O". With config.scheme "none" the tags of
    config.column are a plain tag set (labels: the training file's tags, sorted), scored by token accuracy; cut
    words are predicted "O" where the tag set has it, else the first label.
    """

    model_class_name = "BertForTokenClassification"
    model_role = "token"
    metric_names = ("f1", "precision", "recall", "accuracy")
    main_metric = "f1"

    def __init__(self, config) -> None:
        super().__init__(config)
        self.column = getattr(config, "column", None) or -1  # the tag column (default: the last)
        self.scheme = "BIO"
        self._plain(getattr(config, "scheme", "auto") == "none")

    def _plain(self, plain: bool) -> None:
        """Switch to plain tags (scheme "none": token accuracy) or stay with entity tags."""
        if plain:
            self.scheme, self.main_metric, self.metric_names = "none", "accuracy", ("accuracy",)

    def read(self, path, training: bool) -> list[tuple[list[str], list[str]]]:
        """(words, tags) of every sentence; the training file fixes the scheme and the labels."""
        plain = self.scheme == "none"
        sentences = self.read_sentences(path, plain)
        if not sentences:
            raise DataError.at(path, None, "no sentences")
        iobes = any(t[0] in "ES" for s in sentences for t in s.tags)
        if training and plain:
            self.labels = sorted({t for s in sentences for t in s.tags})
        elif training:
            self.scheme = "IOBES" if iobes else "BIO"
            kinds = sorted({t[2:] for s in sentences for t in s.tags if t != "O"})
            prefixes = "BIES" if iobes else "BI"
            self.labels = ["O"] + [f"{p}-{k}" for k in kinds for p in prefixes]
        known = set(self.labels)
        out = []
        for s in sentences:
            # CoNLL-2003 is IOB1; BIO (IOB2) is what the model learns. Valid BIO and IOBES pass through unchanged.
            tags = s.tags if self.scheme in ("IOBES", "none") else iob1_to_bio(s.tags)
            for i, (written, tag) in enumerate(zip(s.tags, tags)):
                if tag not in known:
                    where = s.line if isinstance(s.line, Row) else s.line + i  # a table's row, or the word's line
                    raise DataError.at(path, where, f"unknown label {written!r}; the training file has "
                                                    f"{self.labels}")
            out.append((s.tokens, tags))
        return out

    def read_sentences(self, path, plain: bool) -> list[TaggedSentence]:
        """The sentences of a CoNLL file or of a table (config.format, tokens_column, tags_column, records)."""
        c = self.config
        fmt = table_format_of(path, getattr(c, "format", None))
        if fmt is None:
            return read_conll(path, tag_column=self.column, plain=plain)
        return read_tagged_table(path, getattr(c, "tokens_column", "tokens"), getattr(c, "tags_column", "ner_tags"),
                                 format=fmt, records=getattr(c, "records", None), plain=plain)

    def features(self, examples, tokenizer, training: bool) -> list[dict[str, Any]]:
        to_id = {name: i for i, name in enumerate(self.labels)}
        encoded = encode_words(tokenizer, [words for words, _ in examples], self.config.seq_length)
        for feature, (words, tags) in zip(encoded, examples):
            feature["labels"] = align_labels(feature["word_ids"], tags, to_id)
        return encoded

    def model_kwargs(self) -> dict[str, Any]:
        return {"num_labels": len(self.labels), "labels": list(self.labels)}

    def objective(self):
        return TokenClassificationTask()

    def word_tags(self, logits: list[np.ndarray], features, examples) -> list[list[str]]:
        """Each word's tag, read from its first sub-word's (T_i, num_labels) logits."""
        out = []
        for scores, feature, (words, _) in zip(logits, features, examples):
            ids = decode_word_predictions(feature["word_ids"], scores.argmax(-1).tolist(), len(words),
                                          fill=self._outside())
            out.append([self.labels[i] for i in ids])  # words cut off by max_seq_length are predicted "O"
        return out

    def _outside(self) -> int:
        """The label of words cut off by max_seq_length: "O", or for a plain tag set without it the first."""
        return self.labels.index("O") if "O" in self.labels else 0

    def _score(self, gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, Any]:
        return tag_accuracy(gold, predicted) if self.scheme == "none" else ner_metrics(gold, predicted)

    def evaluate(self, examples, features, logits):
        predicted = self.word_tags(logits, features, examples)
        return self._score([tags for _, tags in examples], predicted), predicted

    def write_predictions(self, out_dir: Path, examples, predicted) -> None:
        # conlleval's layout: word, gold tag, predicted tag; a blank line between sentences.
        lines = []
        for (words, gold), tags in zip(examples, predicted):
            lines += [f"{w} {g} {p}" for w, g, p in zip(words, gold, tags)] + [""]
        (Path(out_dir) / "dev_predictions.conll").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def task_info(self) -> dict[str, Any]:
        return {**super().task_info(), "scheme": self.scheme, "column": self.column}

    # ---- a fine-tuned model ----------------------------------------------------------------------------------
    def restore(self, info: dict[str, Any], model) -> None:
        self.labels = list(model.labels)
        self.scheme = info.get("scheme", self.scheme)
        self._plain(self.scheme == "none")

    input_fields = (("text",), ())
    sample_input = {"text": "warm up"}

    @classmethod
    def input_from_json(cls, item: dict[str, Any]):
        """A text, or a list of words (as `predict` takes them)."""
        words = item.get("text")
        if isinstance(words, list) and words and all(isinstance(w, str) for w in words):
            return list(words)
        return json_text(item, "text")

    def truncated(self, x, features, tokenizer) -> bool:
        if not cut_at([features[0]["input_ids"]], self.config.seq_length):  # nothing cut: no second encoding
            return False  # else: CLS, the words' pieces, SEP (`encode_words`)
        return len(tokenizer.encode_words([features[0]["words"]])[0].ids) + 2 > self.config.seq_length

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        if "entities" not in result:  # plain tags (scheme none): word/TAG
            return " ".join(f"{w}/{t}" for w, t in zip(result["words"], result["tags"]))
        return "  ".join(f"[{e['type']} {e['text']}] ({e['score']:.2f})" for e in result["entities"]) or "(none)"

    def prediction_features(self, inputs: Sequence, tokenizer) -> list[dict[str, Any]]:
        """inputs: texts (split into words and punctuation by `split_words`) or lists of words."""
        sentences, self._spans = [], []
        for x in inputs:
            if isinstance(x, str):
                pieces = split_words(x)
                sentences.append([w for w, _, _ in pieces])
                self._spans.append((x, [(s, e) for _, s, e in pieces]))
            else:
                sentences.append(list(x))
                self._spans.append((None, None))
        features = encode_words(tokenizer, sentences, self.config.seq_length)
        for feature, words in zip(features, sentences):
            feature["words"] = words
        return features

    def predictions(self, inputs, features, logits, top_k: int | None = None) -> list[dict[str, Any]]:
        """{"words", "tags", "entities": [{"type", "text", "start", "end", "score"}]} per input: start and end in
        characters of a text, or word indices of a list of words; score = the mean of the words' top probability.
        Plain tags (scheme "none"): {"words", "tags", "scores"} (each word's top probability), no entities."""
        outside = self._outside()  # for words cut off by truncation
        out = []
        for feature, scores, (text, offsets) in zip(features, logits, self._spans):
            words = feature["words"]
            probs = softmax(scores)
            ids = decode_word_predictions(feature["word_ids"], probs.argmax(-1).tolist(), len(words), fill=outside)
            confidence = decode_word_predictions(feature["word_ids"], probs.max(-1).tolist(), len(words), fill=0.0)
            tags = [self.labels[i] for i in ids]
            if self.scheme == "none":
                out.append({"words": words, "tags": tags, "scores": [float(c) for c in confidence]})
                continue
            entities = []
            for etype, first, last in tags_to_spans(tags):
                entity = {"type": etype, "score": float(np.mean(confidence[first:last]))}
                if text is not None:
                    start, end = offsets[first][0], offsets[last - 1][1]
                    entity.update(text=text[start:end], start=start, end=end)
                else:
                    entity.update(text=" ".join(words[first:last]), start=first, end=last)
                entities.append(entity)
            out.append({"words": words, "tags": tags, "entities": entities})
        return out

    def evaluate_file(self, data_path, predictions_path, null_odds_path=None) -> dict[str, Any]:
        """Entity-level scores (plain tags: token accuracy) of a CoNLL file whose last column is the predicted tag
        (words as in data_path, whose tags are in config.column)."""
        plain = self.scheme == "none"
        gold = self.read_sentences(data_path, plain)
        pred = read_conll(predictions_path, plain=plain)
        check_count(pred, gold, predictions_path, data_path)
        for g, p in zip(gold, pred):
            if g.tokens != p.tokens:
                i = next((i for i, (a, b) in enumerate(zip(g.tokens, p.tokens)) if a != b),
                         min(len(g.tokens), len(p.tokens)))
                raise DataError.at(predictions_path, p.line + min(i, len(p.tokens) - 1),
                                   f"the sentence does not match {data_path}:{g.line} (word {i + 1})")
        return self._score([g.tags for g in gold], [p.tags for p in pred])
