"""SQuAD v1.1 / v2.0: reading, sliding-window features, span post-processing, the official evaluation, and
`SquadFamily`, the fine-tuning kind "squad" (loss, dev evaluation, predictions.json / null_odds.json, predictions).

Pipeline: `read_squad` → tokenize question and context with any tokenizer that gives character offsets →
`make_windows` (one example → one or more windows of `max_seq_length` tokens) → model start/end logits per
window → `postprocess` (best span per question, as Google's `run_squad.py` `write_predictions`) →
`evaluate_v1` / `evaluate_v2` (the official evaluation scripts, re-implemented line for line). `read_squad` also
reads KorQuAD 1.0 (SQuAD v1.1's layout) and tables of questions as the Hub's squad / squad_v2 store them (Parquet,
Arrow, `datasets` directories, JSON Lines: `read_squad_table`). The windows and the post-processing live in
`bertkit.tasks.squad_windows` (their names are importable from here too).

Conventions copied from Google's `run_squad.py` because fine-tuned checkpoints and published numbers depend on
them:
  * window layout `[CLS] question [SEP] passage [SEP] [PAD]...`; segment 0 for [CLS], question and first [SEP],
    segment 1 for the passage and the final [SEP]. Other tokenizers frame the pair their own way, as they frame
    any pair (`pair_separators`, `pair_type_id`): RoBERTa's window is `<s> question </s></s> passage </s>`, all of
    segment 0, as transformers' RobertaTokenizerFast frames a question and its context;
  * passage windows start every `doc_stride` tokens; a token seen in several windows is scored only in the one
    where it has the most context (`_check_is_max_context`: min(left, right) + 0.01 * window length);
  * training targets are token positions inside the window, and (0, 0), i.e. [CLS], when the answer is not
    wholly inside the window or the question is unanswerable;
  * SQuAD 2.0 null score s_null = min over windows of start_logit[CLS] + end_logit[CLS]; the answer is "" when
    s_null - best_non_null_score > null_threshold (Google's `null_score_diff_threshold`). The paper writes the
    same rule as "predict a span when s_best > s_null + τ", so null_threshold = -τ; on a tie Google (and this
    code) answers with the span;
  * the answer text of a WordPiece model is Google's `get_final_text`: the whitespace-separated words of the
    context that the span's pieces come from, joined by single spaces, trimmed to the characters the pieces
    match after BERT's basic tokenisation (the whole words when they cannot be matched). Other tokenizers' spans
    are cut from the original context with the tokens' character offsets (start of the first to end of the
    last); `postprocess` does that by default.
"""

from __future__ import annotations

import collections
import json
import os
import re
import string
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from bertkit.data.readers import MISSING, Table, field, table_or_own_format, text_cell
from bertkit.errors import DataError
from bertkit.io import read_json_object
from bertkit.tasks.base import TaskFamily, json_text, register
# The windows and their post-processing (names importable from here too, as the docs and tests use them).
from bertkit.tasks.squad_windows import (SquadWindow, answer_text_for, basic_tokenize, char_span_to_token_span,
                                         get_final_text, google_answer_text, make_windows, postprocess,
                                         whitespace_words)

# ---------------------------------------------------------------------------------------------------------------
# Reading


@dataclass(frozen=True)
class SquadExample:
    """One question about one paragraph."""

    id: str  # the question id ("qid"), key of predictions.json
    question: str
    context: str  # the paragraph, verbatim
    answers: list[tuple[str, int]]  # gold (text, answer_start character index); training uses the first
    is_impossible: bool  # SQuAD 2.0 unanswerable question (then `answers` is empty)
    title: str = ""  # title of the article the paragraph is from


@dataclass(frozen=True)
class AnswerMismatch:
    """A gold answer whose text is not found at its stated character position in the context."""

    qid: str
    answer_index: int  # position in the question's answer list
    text: str  # the answer text in the file
    start: int  # the answer_start in the file
    found: str  # context[start:start + len(text)]


@dataclass(frozen=True)
class SquadReadStats:
    """What `read_squad_with_stats` saw; mismatches are kept in the examples but listed here."""

    path: str
    articles: int
    examples: int
    answers: int
    impossible: int
    mismatches: list[AnswerMismatch]


def squad_table_format(path: str | os.PathLike[str], format: str | None = None) -> str | None:
    """The table format a SQuAD file is read in, or None for SQuAD's own JSON layout (the default for .json;
    format "squad" forces it): JSON Lines, Parquet, Arrow and `datasets` directories are tables of questions."""
    return table_or_own_format(path, format, "squad", ("json",))


def read_squad_table(path: str | os.PathLike[str], format: str | None = None,
                     records: str | None = None) -> tuple[list[SquadExample], SquadReadStats]:
    """Questions from a table as the Hub's squad and squad_v2 store them: columns id, title (optional), context,
    question and answers, a struct {"text": [...], "answer_start": [...]} (no answer: SQuAD 2.0's unanswerable
    question). Answers are checked against their context as in `read_squad_with_stats`. DataError naming the file,
    the row and the column for a missing column (with those the file has), a null cell or a cell of the wrong type."""
    table = Table(path, format, records)
    table.require("id", "context", "question", "answers")
    examples: list[SquadExample] = []
    mismatches: list[AnswerMismatch] = []
    titles: set[str] = set()
    n_answers = 0
    wanted = ["id", "context", "question", "answers"] + (["title"] if "title" in (table.columns or ["title"]) else [])
    for where, record in table.rows(wanted):
        raw_id = field(record, "id")
        if raw_id is MISSING or raw_id is None or isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
            raise DataError.at(path, where, f"the column 'id' must be a string or an integer, found "
                                            f"{'nothing' if raw_id is MISSING else _short(raw_id)}")
        qid = str(raw_id)
        context = text_cell(path, where, record, "context", "context")
        question = text_cell(path, where, record, "question", "question")
        title = record.get("title") if isinstance(record.get("title"), str) else ""
        titles.add(title)
        answers_cell = field(record, "answers")
        texts = answers_cell.get("text") if isinstance(answers_cell, dict) else None
        starts = answers_cell.get("answer_start") if isinstance(answers_cell, dict) else None
        if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
            raise DataError.at(path, where, f"question {qid}: the column 'answers' must be "
                                            f'{{"text": [...], "answer_start": [...]}} of equal lengths, found '
                                            f"{_short(answers_cell) if answers_cell is not MISSING else 'nothing'}")
        answers = []
        for i, (text, start) in enumerate(zip(texts, starts)):
            if not isinstance(text, str) or isinstance(start, bool) or not isinstance(start, int):
                raise DataError.at(path, where, f"question {qid} answer {i}: text must be a string and answer_start "
                                                f"an integer, found {_short(text)} and {_short(start)}")
            found = context[start:start + len(text)] if start >= 0 else ""
            if found != text:
                mismatches.append(AnswerMismatch(qid=qid, answer_index=i, text=text, start=start, found=found))
            answers.append((text, start))
        n_answers += len(answers)
        examples.append(SquadExample(id=qid, question=question, context=context, answers=answers,
                                     is_impossible=not answers, title=title))
    stats = SquadReadStats(path=os.fspath(path), articles=len(titles), examples=len(examples), answers=n_answers,
                           impossible=sum(e.is_impossible for e in examples), mismatches=mismatches)
    return examples, stats


def read_squad_with_stats(path: str | os.PathLike[str], format: str | None = None,
                          records: str | None = None) -> tuple[list[SquadExample], SquadReadStats]:
    """Read a SQuAD v1.1 or v2.0 JSON file (KorQuAD 1.0 has v1.1's layout), or a table of questions
    (`read_squad_table`; `squad_table_format` tells which), checking every answer against its context.

    Every answer must satisfy `context[answer_start:answer_start + len(text)] == text`; the ones that do not are
    kept (dropping them would silently shrink the training set) and listed in the returned stats.

    Returns:
        (examples in file order, stats).
    Raises:
        DataError "{path}:{line}: ..." naming the question id (or article/paragraph index) for a missing key or a
        value of the wrong type (a context, question or answer text that is not a string, say; the line is that of
        the question's id, and absent where it cannot be told).
    """
    fmt = squad_table_format(path, format)
    if fmt is not None:
        return read_squad_table(path, fmt, records)
    dataset = read_json_object(path, "SQuAD file")
    if not isinstance(dataset.get("data"), list):
        raise DataError.at(path, None, "expected a JSON object with a 'data' list (SQuAD format)")

    def need(record, key: str, where: str, kind: type | tuple[type, ...] = object, qid=None):
        """record[key], which must be of `kind`; DataError naming the place (and, for a question, its line)."""
        if not isinstance(record, dict) or key not in record:
            raise DataError.at(path, None, f"{where}: missing key {key!r}")
        value = record[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):  # True is an int
            names = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)
            raise DataError.at(path, _line_of(path, qid), f"{where}: {key} must be {names}, "
                                                          f"found {type(value).__name__} {_short(value)}")
        return value

    examples: list[SquadExample] = []
    mismatches: list[AnswerMismatch] = []
    n_answers = 0
    for a, article in enumerate(dataset["data"]):
        title = article.get("title", "") if isinstance(article, dict) else ""
        title = title if isinstance(title, str) else str(title)
        for p, paragraph in enumerate(need(article, "paragraphs", f"article {a}", list)):
            qas = need(paragraph, "qas", f"article {a} paragraph {p}", list)
            first = qas[0].get("id") if qas and isinstance(qas[0], dict) else None
            context = need(paragraph, "context", f"article {a} paragraph {p}", str, first)
            for q, qa in enumerate(qas):
                raw_id = need(qa, "id", f"article {a} paragraph {p} question {q}", (str, int))
                qid = str(raw_id)
                question = need(qa, "question", f"question {qid}", str, raw_id)
                impossible = qa.get("is_impossible", False) if isinstance(qa, dict) else False
                if not isinstance(impossible, bool):
                    raise DataError.at(path, _line_of(path, raw_id), f"question {qid}: is_impossible must be true "
                                                                     f"or false, found {_short(impossible)}")
                answers = []
                for i, answer in enumerate(need(qa, "answers", f"question {qid}", list, raw_id)):
                    text = need(answer, "text", f"question {qid} answer {i}", str, raw_id)
                    start = need(answer, "answer_start", f"question {qid} answer {i}", int, raw_id)
                    found = context[start:start + len(text)] if start >= 0 else ""
                    if found != text:
                        mismatches.append(AnswerMismatch(qid=qid, answer_index=i, text=text, start=start,
                                                         found=found))
                    answers.append((text, start))
                n_answers += len(answers)
                examples.append(SquadExample(id=qid, question=question, context=context, answers=answers,
                                             is_impossible=impossible, title=title))
    stats = SquadReadStats(path=os.fspath(path), articles=len(dataset["data"]), examples=len(examples),
                           answers=n_answers, impossible=sum(e.is_impossible for e in examples),
                           mismatches=mismatches)
    return examples, stats


_KIND_NAMES = {str: "a string", int: "an integer", list: "a list"}


def _short(value) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _line_of(path, qid) -> int | None:
    """The line of a SQuAD file where question `qid` is (its id written as JSON), for error messages; None when
    the id cannot be found (or is None)."""
    if qid is None:
        return None
    needles = {json.dumps(qid), json.dumps(qid, ensure_ascii=False)}
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if any(n in line for n in needles) and '"id"' in line:
                    return number
    except (OSError, UnicodeDecodeError):
        pass
    return None


def read_squad(path: str | os.PathLike[str]) -> list[SquadExample]:
    """`read_squad_with_stats` that warns (file, count, first question ids) when answers mismatch their context."""
    examples, stats = read_squad_with_stats(path)
    if stats.mismatches:
        first = ", ".join(m.qid for m in stats.mismatches[:5])
        warnings.warn(f"{stats.path}: {len(stats.mismatches)} of {stats.answers} answers do not match "
                      f"context[answer_start:answer_start+len(text)] (kept); first question ids: {first}",
                      stacklevel=2)
    return examples


# ---------------------------------------------------------------------------------------------------------------
# The output files


def _write_json(path: str | os.PathLike[str], obj) -> None:
    # indent=4 and a trailing newline, exactly as Google's run_squad.py writes its output files.
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=4) + "\n")


def write_predictions(path: str | os.PathLike[str], predictions: Mapping[str, str]) -> None:
    """Write predictions.json in the official format: {qid: answer text}."""
    _write_json(path, dict(predictions))


def write_null_odds(path: str | os.PathLike[str], null_odds: Mapping[str, float]) -> None:
    """Write null_odds.json in the official format ({qid: float}), the --na-prob-file of evaluate-v2.0.py."""
    _write_json(path, {k: float(v) for k, v in null_odds.items()})


# ---------------------------------------------------------------------------------------------------------------
# Official evaluation (evaluate-v1.1.py and evaluate-v2.0.py)


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace (official order)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


_PUNCTUATION = set(string.punctuation)


def _tokens(s: str) -> list[str]:
    return normalize_answer(s).split() if s else []


def compute_exact(a_gold: str, a_pred: str) -> int:
    """1 if the normalised strings are equal, else 0."""
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold: str, a_pred: str) -> float:
    """Token F1 of normalised answers, v2.0 rule: if either side is empty, 1.0 when both are, else 0.0."""
    gold, pred = _tokens(a_gold), _tokens(a_pred)
    if not gold or not pred:
        return float(gold == pred)
    return _overlap_f1(gold, pred)


def _overlap_f1(gold: list[str], pred: list[str]) -> float:
    num_same = sum((collections.Counter(gold) & collections.Counter(pred)).values())
    if num_same == 0:
        return 0.0
    precision, recall = num_same / len(pred), num_same / len(gold)
    return 2 * precision * recall / (precision + recall)


def evaluate_v1(examples: Sequence[SquadExample], predictions: Mapping[str, str]) -> dict[str, float]:
    """evaluate-v1.1.py: {"exact_match", "f1"} in percent, max over gold answers.

    A question without a prediction scores 0 (with a warning) and still counts in the total. v1.1's F1 is 0
    whenever no token is shared, even for two empty answers.
    """
    exact = f1 = 0.0
    missing = []
    for example in examples:
        if example.id not in predictions:
            missing.append(example.id)
            continue
        pred = predictions[example.id]
        golds = [text for text, _ in example.answers]
        exact += max((compute_exact(g, pred) for g in golds), default=0)
        f1 += max((_overlap_f1(normalize_answer(g).split(), normalize_answer(pred).split()) for g in golds),
                  default=0.0)
    if missing:
        warnings.warn(f"{len(missing)} unanswered question(s) score 0; first: {missing[0]}", stacklevel=2)
    total = len(examples)
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


def find_best_threshold(predictions: Mapping[str, str], scores: Mapping[str, float],
                        null_odds: Mapping[str, float], qid_to_has_ans: Mapping[str, bool]) -> tuple[float, float]:
    """evaluate-v2.0.py `find_best_thresh`: the null-odds threshold that maximises a score, and that score.

    Start from answering "" everywhere (score = number of unanswerable questions); walk the questions in
    increasing null odds, switching each to its predicted answer (gain: its raw score if answerable, -1 if
    unanswerable and the prediction is non-empty); keep the best running total and the odds where it was
    reached (first reached on ties; 0.0 if answering "" everywhere is best).

    Returns:
        (best score in percent of len(scores), threshold): predict "" when null_odds > threshold.
    """
    cur = best = sum(1 for has in qid_to_has_ans.values() if not has)
    best_thresh = 0.0
    for qid in sorted(null_odds, key=lambda k: null_odds[k]):
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if predictions[qid] else 0
        cur += diff
        if cur > best:
            best, best_thresh = cur, null_odds[qid]
    return 100.0 * best / len(scores), best_thresh


def evaluate_v2(examples: Sequence[SquadExample], predictions: Mapping[str, str],
                null_odds: Mapping[str, float] | None = None, na_prob_thresh: float = 1.0) -> dict[str, float]:
    """evaluate-v2.0.py: exact/f1/total, HasAns_* and NoAns_* breakdowns, and best thresholds.

    Gold answers that normalise to "" are dropped; a question with none left has the single gold "". A
    question without a prediction is skipped (with a warning) and not counted, as in the official script.
    With `null_odds` (the --na-prob-file), a question whose odds exceed `na_prob_thresh` counts as answered ""
    for exact/f1, and best_exact, best_exact_thresh, best_f1, best_f1_thresh are added.

    Returns:
        The official dict: percentages, plus the counts "total", "HasAns_total", "NoAns_total".
    """
    qid_to_has_ans = {e.id: bool(e.answers) for e in examples}
    exact_raw: dict[str, float] = {}
    f1_raw: dict[str, float] = {}
    missing = []
    for example in examples:
        golds = [text for text, _ in example.answers if normalize_answer(text)] or [""]
        if example.id not in predictions:
            missing.append(example.id)
            continue
        pred = predictions[example.id]
        exact_raw[example.id] = max(compute_exact(g, pred) for g in golds)
        f1_raw[example.id] = max(compute_f1(g, pred) for g in golds)
    if missing:
        warnings.warn(f"{len(missing)} question(s) without a prediction are not scored; first: {missing[0]}",
                      stacklevel=2)
    if not exact_raw:
        raise ValueError("no question has a prediction")
    if null_odds is not None:
        absent = [qid for qid in exact_raw if qid not in null_odds]
        if absent:
            raise ValueError(f"{len(absent)} question(s) have no null odds; first: {absent[0]}")
    odds = dict(null_odds) if null_odds is not None else {qid: 0.0 for qid in predictions}

    def thresholded(raw: dict[str, float]) -> dict[str, float]:
        return {qid: float(not qid_to_has_ans[qid]) if odds[qid] > na_prob_thresh else s for qid, s in raw.items()}

    exact_t, f1_t = thresholded(exact_raw), thresholded(f1_raw)

    def summary(qids: list[str]) -> tuple[float, float, int]:
        n = len(qids)
        return 100.0 * sum(exact_t[q] for q in qids) / n, 100.0 * sum(f1_t[q] for q in qids) / n, n

    out: dict[str, float] = {}
    out["exact"], out["f1"], out["total"] = summary(list(exact_t))
    for name, want in (("HasAns", True), ("NoAns", False)):
        qids = [q for q in exact_t if qid_to_has_ans[q] == want]
        if qids:
            out[f"{name}_exact"], out[f"{name}_f1"], out[f"{name}_total"] = summary(qids)
    if null_odds is not None:
        out["best_exact"], out["best_exact_thresh"] = find_best_threshold(predictions, exact_raw, odds,
                                                                          qid_to_has_ans)
        out["best_f1"], out["best_f1_thresh"] = find_best_threshold(predictions, f1_raw, odds, qid_to_has_ans)
    return out


def squad_evaluate(examples: Sequence[SquadExample], predictions: Mapping[str, str],
                   null_odds: Mapping[str, float] | None = None, version_2: bool = False) -> dict[str, float]:
    """The official evaluation for the dataset version: `evaluate_v2` if version_2 else `evaluate_v1`."""
    return evaluate_v2(examples, predictions, null_odds) if version_2 else evaluate_v1(examples, predictions)


# ---------------------------------------------------------------------------------------------------------------
# The loss and the family


class SpanTask:
    """Trainer task: the mean of start and end cross-entropies over window positions (0 = CLS = no answer here)."""

    name = "span"

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        return {"span_loss": float(batch["start_positions"].shape[0])}

    def __call__(self, model, batch):
        import torch.nn.functional as F  # torch only when a model trains: reading needs none

        from bertkit.models.layouts import host_count  # torch-free module: only the loss needs torch

        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits.float()
        start, end = batch["start_positions"], batch["end_positions"]
        loss = (F.cross_entropy(logits[..., 0], start, reduction="sum")
                + F.cross_entropy(logits[..., 1], end, reduction="sum")) / 2
        return {"span_loss": (loss, host_count(start.shape[0], loss.device))}


@register("squad")
class SquadFamily(TaskFamily):
    """SQuAD v1.1 / v2.0 extractive QA: windows of the passage, best span (or no answer) per question.

    The dataset version is v2.0 as soon as a file has an unanswerable question; its dev-chosen null threshold is
    saved with the model so that `predict` answers "" as the dev predictions did.
    """

    model_class_name = "BertForQuestionAnswering"
    model_role = "qa"

    def __init__(self, config) -> None:
        super().__init__(config)
        self.version_2 = False
        self.null_threshold = 0.0
        self.answer_text: Callable[[SquadWindow, int, int], str] | None = None

    @property
    def metric_names(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("exact", "f1", "best_exact", "best_f1", "best_f1_thresh") if self.version_2 else ("exact_match", "f1")

    @property
    def main_metric(self) -> str:  # type: ignore[override]
        return "best_f1" if self.version_2 else "f1"

    def read(self, path, training: bool) -> list[SquadExample]:
        examples, stats = read_squad_with_stats(path, **self.table_options())
        if not examples:
            raise DataError.at(path, None, "no questions")
        self.version_2 = self.version_2 or any(e.is_impossible for e in examples)
        self.stats["train" if training else "dev"] = {
            "articles": stats.articles, "questions": stats.examples, "answers": stats.answers,
            "impossible": stats.impossible, "answers_not_matching_context": len(stats.mismatches),
            "first_mismatches": [m.qid for m in stats.mismatches[:5]]}
        if stats.mismatches:
            print(f"{path}: {len(stats.mismatches)} of {stats.answers} answers do not match "
                  f"context[answer_start:answer_start+len(text)]; first question ids: "
                  f"{', '.join(m.qid for m in stats.mismatches[:5])}"
                  + (" (skipped for training)" if training else ""), flush=True)
        return examples

    def windows(self, examples, tokenizer, training: bool) -> tuple[list[SquadWindow], int]:
        """Windows of every example, framed as the tokenizer frames a (question, passage) pair; for training,
        examples whose answer does not match its context are skipped (and counted)."""
        c = self.config
        self.answer_text = answer_text_for(tokenizer)
        contexts = sorted({e.context for e in examples})
        encoded = tokenizer.encode_raw(contexts)
        by_context = {t: (enc.ids, enc.offsets) for t, enc in zip(contexts, encoded)}
        questions = tokenizer.encode_raw([e.question for e in examples])
        windows, skipped = [], 0
        for example, question in zip(examples, questions):
            answer = None
            if training and not example.is_impossible:
                if not example.answers:
                    skipped += 1
                    continue
                text, start = example.answers[0]
                if example.context[start:start + len(text)] != text:
                    skipped += 1  # as Google's run_squad.py: an answer not found in its context is not trained on
                    continue
                answer = (text, start)
            ids, offsets = by_context[example.context]
            try:
                windows += make_windows(question.ids, ids, offsets, qid=example.id, context=example.context,
                                        cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id, pad_id=tokenizer.pad_id,
                                        max_seq_length=c.seq_length, doc_stride=c.doc_stride,
                                        max_query_length=c.max_query_length, answer=answer,
                                        is_impossible=training and example.is_impossible, pad_to_max_length=False,
                                        pair_separators=tokenizer.pair_separators,
                                        pair_type_id=tokenizer.pair_type_id)
            except ValueError:
                if not training:
                    raise
                skipped += 1  # an answer made of characters no token covers (whitespace, say)
        return windows, skipped

    def features(self, examples, tokenizer, training: bool) -> list[dict[str, Any]]:
        windows, skipped = self.windows(examples, tokenizer, training)
        if training:
            self.stats["train"]["skipped_for_training"] = skipped
            self.stats["train"]["windows"] = len(windows)
        else:
            self.dev_windows = windows
        return [{"input_ids": w.input_ids, "token_type_ids": w.token_type_ids,
                 "start_position": w.start_position, "end_position": w.end_position} for w in windows]

    def objective(self):
        return SpanTask()

    def predict_windows(self, logits: list[np.ndarray], windows, null_threshold: float):
        """`postprocess` of (T_i, 2) logits per window: (predictions, null odds, n-best) per question."""
        return postprocess(windows, [x[:, 0] for x in logits], [x[:, 1] for x in logits],
                           n_best_size=self.config.n_best_size, max_answer_length=self.config.max_answer_length,
                           version_2=self.version_2, null_threshold=null_threshold, answer_text=self.answer_text)

    def evaluate(self, examples, features, logits):
        predictions, null_odds, _ = self.predict_windows(logits, self.dev_windows, 0.0)
        metrics = squad_evaluate(examples, predictions, null_odds if self.version_2 else None, self.version_2)
        if self.version_2:
            # The threshold chosen on dev: the written predictions.json answers "" where the null odds exceed it.
            predictions, null_odds, _ = self.predict_windows(logits, self.dev_windows, metrics["best_f1_thresh"])
        return metrics, (predictions, null_odds, metrics.get("best_f1_thresh", 0.0))

    def write_predictions(self, out_dir: Path, examples, output) -> None:
        predictions, null_odds, threshold = output
        self.null_threshold = threshold
        write_predictions(Path(out_dir) / "predictions.json", predictions)
        if self.version_2:
            write_null_odds(Path(out_dir) / "null_odds.json", null_odds)

    def task_info(self) -> dict[str, Any]:
        c = self.config
        return {**super().task_info(), "version_2": self.version_2, "null_threshold": self.null_threshold,
                "doc_stride": c.doc_stride, "max_query_length": c.max_query_length,
                "max_answer_length": c.max_answer_length, "n_best_size": c.n_best_size}

    # ---- a fine-tuned model ----------------------------------------------------------------------------------
    def restore(self, info: dict[str, Any], model) -> None:
        self.version_2 = bool(info.get("version_2", False))
        self.null_threshold = float(info.get("null_threshold", 0.0))

    input_fields = (("question", "context"), ())
    sample_input = {"question": "warm up?", "context": "warm up"}

    @classmethod
    def input_from_json(cls, item: dict[str, Any]) -> tuple[str, str]:
        question, context = json_text(item, "question"), json_text(item, "context")
        if not question.strip() or not context.strip():
            raise ValueError("the question and the context must not be empty")
        return question, context

    @classmethod
    def served_facts(cls, info: dict[str, Any]) -> dict[str, Any]:
        return {"version_2": bool(info.get("version_2", False))}

    def truncated(self, x, features, tokenizer) -> bool:
        # The passage is covered by windows (never cut); the question is cut to max_query_length.
        return len(tokenizer.encode_raw([x[0]])[0].ids) > self.config.max_query_length

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        score = f" ({result['score']:.3f})" if result.get("score") is not None else ""  # T5: generated
        return f"{result['answer'] or '(no answer)'}{score}"

    def prediction_features(self, inputs: Sequence, tokenizer) -> list[dict[str, Any]]:
        """inputs: (question, context) tuples; one feature per window."""
        self._examples = [SquadExample(id=str(i), question=q, context=c, answers=[], is_impossible=False)
                          for i, (q, c) in enumerate(inputs)]
        self._windows, _ = self.windows(self._examples, tokenizer, training=False)
        return [{"input_ids": w.input_ids, "token_type_ids": w.token_type_ids} for w in self._windows]

    def predictions(self, inputs, features, logits, top_k: int | None = None) -> list[dict[str, Any]]:
        """{"answer", "score" (n-best probability), "start_logit", "end_logit", "nbest"} per question, with
        "start" and "end" (the answer's characters in the context) for a non-empty answer; "" is a SQuAD 2.0
        model's no-answer (its dev-chosen null threshold), which adds "null_odds"."""
        predictions, null_odds, nbest = self.predict_windows(logits, self._windows, self.null_threshold)
        out = []
        for example in self._examples:
            answer = predictions[example.id]
            top = next((n for n in nbest[example.id] if n["text"] == answer), {"probability": 0.0,
                                                                               "start_logit": 0.0, "end_logit": 0.0})
            record = {"answer": answer, "score": top["probability"], "start_logit": top["start_logit"],
                      "end_logit": top["end_logit"], "nbest": nbest[example.id][:top_k or 5]}
            if "start" in top:
                record["start"], record["end"] = top["start"], top["end"]
            if self.version_2:
                record["null_odds"] = null_odds[example.id]
            out.append(record)
        return out

    def evaluate_file(self, data_path, predictions_path, null_odds_path=None) -> dict[str, Any]:
        """The official scripts' output for predictions.json (and null_odds.json); v2.0 when the data has
        unanswerable questions or null odds are given."""
        examples, _ = read_squad_with_stats(data_path, **self.table_options())
        predictions = read_json_object(predictions_path)
        null_odds = read_json_object(null_odds_path) if null_odds_path is not None else None
        version_2 = any(e.is_impossible for e in examples) or null_odds is not None
        return squad_evaluate(examples, {k: str(v) for k, v in predictions.items()}, null_odds, version_2)
