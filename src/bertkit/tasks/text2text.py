"""Text to text: every task as T5 does it, an input text written by the encoder-decoder into an output text.

An encoder-decoder (T5) has no classifier or span head: `bertkit finetune glue|classify|squad` with a T5 model
directory fine-tunes it to write the answer (Raffel et al., 2020, section 2.4 and appendix D). The input names the
task and its fields, the target is the answer as words, and evaluation decodes greedily and scores the generated
text with the same official metrics as the BERT heads:

    glue      "{task} {field}: {text}[ {field}: {pair}]" with T5's field names and order (mnli hypothesis first)
              -> T5's label word ("sst2 sentence: a gem." -> "positive"; "mrpc sentence1: ... sentence2: ..." ->
              "equivalent" / "not_equivalent"); STS-B the score rounded to 0.2 ("3.8")
    classify  "classify {text column}: {text}[ {pair column}: {pair}]" -> the label as written in the file (a
              regression score with two decimals)
    squad     "question: {question} context: {context}" -> the first answer's text ("" for SQuAD 2.0's
              unanswerable questions)

A generated text that is no label of the task counts as wrong and is counted ("unrecognized" in the dev metrics;
GLUE's binary metrics see the label other than the gold one, T5's rule); a score that does not parse counts as
-1, T5's default. Inputs longer than max_seq_length and targets longer than max_target_length (EOS included in
both) are cut, never silently: `stats` counts them (results.json "data") and a target cut is said on stderr with
its file and line. The dev predictions file has the format of the BERT heads' (labels as the data file writes
them, or the generated text; SQuAD's predictions.json), so `bertkit evaluate` scores it the same.

`Text2TextFamily` follows the `bertkit.tasks.base` protocol with one addition: `generates` (True), which tells the
drivers to give `evaluate` and `predictions` the greedy generations (int arrays of token ids, EOS excluded) instead
of logits (`bertkit.tasks.run.generate_all`). Reading the files and the official metrics are the kind's own family's.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bertkit.config import IGNORE_INDEX
from bertkit.tasks.base import TaskFamily, family_for, refusal, texts_and_pairs
from bertkit.tasks.classify import Example
from bertkit.tasks.squad import SquadExample, squad_evaluate
from bertkit.tasks.squad import write_predictions as write_squad_predictions

# Kinds an encoder-decoder is fine-tuned for as text to text; the others (ner, swag) need a head per token or per
# choice, which T5 does not have.
TEXT_TO_TEXT_KINDS = ("glue", "classify", "squad")
EMPTY = "<empty>"  # an empty generation in a predictions file of one label per line (a blank line is skipped)

# GLUE as T5 casts it (t5.data.glue_utils and preprocessors.glue): the input fields in T5's order, each T5's name
# and which side of bertkit's Example it is, and the label word of each label as GLUE's files write it.
_SINGLE = (("sentence", "text"),)
_PAIR = (("sentence1", "text"), ("sentence2", "pair"))
_NLI = {"entailment": "entailment", "not_entailment": "not_entailment"}
T5_GLUE: dict[str, tuple[tuple[tuple[str, str], ...], dict[str, str] | None]] = {
    "cola": (_SINGLE, {"0": "unacceptable", "1": "acceptable"}),
    "sst2": (_SINGLE, {"0": "negative", "1": "positive"}),
    "mrpc": (_PAIR, {"0": "not_equivalent", "1": "equivalent"}),
    "stsb": (_PAIR, None),
    "qqp": ((("question1", "text"), ("question2", "pair")), {"0": "not_duplicate", "1": "duplicate"}),
    "mnli": ((("hypothesis", "pair"), ("premise", "text")),
             {"contradiction": "contradiction", "entailment": "entailment", "neutral": "neutral"}),
    "qnli": ((("question", "text"), ("sentence", "pair")), _NLI),
    "rte": (_PAIR, _NLI),
    "wnli": (_PAIR, {"0": "not_entailment", "1": "entailment"}),
}


def text_to_text_family(kind: str, model_type: str, verb: str = "finetune") -> type["Text2TextFamily"]:
    """The family that fine-tunes an encoder-decoder (`model_type`, e.g. t5) for `kind`; ValueError naming the verb,
    the kind and the model type for a kind that needs a head T5 does not have (ner, swag)."""
    message = refusal(model_type, kind, f"bertkit {verb} {kind}")
    if message is not None:  # the matrix's refused cells (bertkit.tasks.base.REFUSED)
        raise ValueError(message)
    if kind not in TEXT_TO_TEXT_KINDS:
        raise ValueError(f"bertkit {verb} {kind}: a {model_type} model (model_type {model_type}) is an "
                         f"encoder-decoder, fine-tuned as text to text for {', '.join(TEXT_TO_TEXT_KINDS)} only")
    return Text2TextFamily


def parse_score(text: str) -> float | None:
    """A generated number ("3.8") as a float; None when it is not one (T5 then scores -1)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def one_line(text: str) -> str:
    """A generated text as one line of a predictions file: whitespace runs as one space, EMPTY for nothing."""
    return " ".join(text.split()) or EMPTY


class Seq2SeqTask:
    """Trainer task: cross-entropy of every target token (the labels, padding IGNORE_INDEX) given the input and the
    target so far (teacher forcing); summed, so that the trainer averages over the global batch."""

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        return {"seq2seq_loss": float((batch["labels"] != IGNORE_INDEX).sum())}

    def __call__(self, model, batch):
        import torch.nn.functional as F  # torch only when a model trains: reading needs none

        # torch-free module: only the loss needs torch
        from bertkit.models.layouts import host_count, mark_host, positions

        labels = batch["labels"]
        # The logits at the real labels only (packed on the model's fast path): (N, V), (N,).
        scores = model(batch["input_ids"], batch["attention_mask"], labels=labels, at_labels=True).logits.float()
        at = positions(mark_host(labels != IGNORE_INDEX, labels, lambda y: y != IGNORE_INDEX))
        targets = labels.reshape(-1).index_select(0, at)  # row-major, as the model packs its logits
        n = host_count(at.numel(), scores.device)
        return {"seq2seq_loss": (F.cross_entropy(scores, targets, reduction="sum"), n),
                "seq2seq_accuracy": ((scores.argmax(-1) == targets).sum().float(), n)}


class Text2TextFamily(TaskFamily):
    """glue, classify or squad (config.kind) as text to text on a T5ForConditionalGeneration; see the module
    docstring. The kind's own family (`base`) reads the files and scores predictions files."""

    model_class_name = "T5ForConditionalGeneration"
    model_role = "seq2seq"  # bertkit.models.ROLE_CLASSES: the encoder-decoder
    generates = True  # evaluate / predictions get greedy generations (token ids), not logits

    def __init__(self, config) -> None:
        super().__init__(config)
        self.kind = config.kind
        text_to_text_family(self.kind, "t5")
        self.base = family_for(self.kind)(config)
        self.stats = self.base.stats  # one record: the reader's counts and the truncations here
        self.task = getattr(self.base, "spec", None)  # GLUE's task row
        self.labels = self.base.labels  # GLUE's fixed labels now; a table's once its training file is read
        self.regression = bool(getattr(self.base, "regression", False))
        self.tokenizer = None  # the tokenizer of the last features: it decodes the generations
        self.paths: dict[bool, str] = {}  # training? -> the file read, for messages

    # ---- settings --------------------------------------------------------------------------------------------
    @property
    def max_input_length(self) -> int:
        """Input tokens, EOS included: max_seq_length, or 128 (SQuAD: 512, T5's, so that the whole passage fits)."""
        return self.config.max_seq_length or (512 if self.kind == "squad" else 128)

    @property
    def max_target_length(self) -> int:
        """Target tokens, EOS included (and the most tokens generated): max_target_length, or 32 (SQuAD 64)."""
        return getattr(self.config, "max_target_length", None) or (64 if self.kind == "squad" else 32)

    @property
    def max_new_tokens(self) -> int:
        return self.max_target_length

    @property
    def classifies(self) -> bool:
        """Whether the target is a label from a fixed set (not a score, not an answer)."""
        return self.kind != "squad" and not self.regression

    @property
    def metric_names(self) -> tuple[str, ...]:  # type: ignore[override]
        if self.kind == "squad":  # generation gives no null odds, hence no best-threshold scores
            return ("exact", "f1") if self.base.version_2 else ("exact_match", "f1")
        return tuple(self.base.metric_names)

    @property
    def main_metric(self) -> str:  # type: ignore[override]
        return "f1" if self.kind == "squad" else self.base.main_metric

    @property
    def words(self) -> dict[str, str]:
        """label as the files write it -> the target word (GLUE: T5's words; classify: the label itself)."""
        if self.task is not None and T5_GLUE[self.task.name][1] is not None:
            return dict(T5_GLUE[self.task.name][1])
        return {label: label for label in self.labels or []}

    # ---- texts -----------------------------------------------------------------------------------------------
    def source(self, example) -> str:
        """The input text of an example (see the module docstring)."""
        if self.kind == "squad":
            return f"question: {example.question} context: {example.context}"
        if self.task is not None:
            fields = T5_GLUE[self.task.name][0]
            parts = [self.task.name] + [f"{name}: {getattr(example, side)}" for name, side in fields
                                        if getattr(example, side) is not None]
            return " ".join(parts)
        c = self.config
        text = f"classify {c.text_column}: {example.text}"
        return text if example.pair is None else f"{text} {c.pair_column}: {example.pair}"

    def target(self, example) -> str:
        """The target text of a labelled example."""
        if self.kind == "squad":
            return example.answers[0][0] if example.answers and not example.is_impossible else ""
        if self.regression:
            if self.task is not None:  # STS-B as T5 writes it: rounded to the nearest 0.2, one decimal
                return f"{round(float(example.label) * 5) / 5:.1f}"
            return f"{round(float(example.label), 2):g}"
        return self.words[example.label]

    def _encode(self, texts: list[str], limit: int, tokenizer) -> tuple[list[list[int]], list[int]]:
        """Texts framed as the tokenizer frames one text (T5: `text </s>`) within `limit` tokens; (ids, the
        indices of the texts that were cut)."""
        room = limit - tokenizer.num_special_tokens()
        if room < 1:
            raise ValueError(f"a length of {limit} tokens leaves no room for text next to the tokenizer's "
                             f"{tokenizer.num_special_tokens()} special token(s)")
        out, cut = [], []
        for i, encoding in enumerate(tokenizer.encode_raw(texts)):
            ids = list(encoding.ids)
            if len(ids) > room:
                ids = ids[:room]
                cut.append(i)
            out.append(tokenizer.build_inputs(ids)[0])
        return out, cut

    # ---- fine-tuning -----------------------------------------------------------------------------------------
    def read(self, path, training: bool) -> list:
        self.paths[training] = str(path)
        examples = self.base.read(path, training)
        self.labels = self.base.labels
        return examples

    def features(self, examples, tokenizer, training: bool) -> list[dict[str, Any]]:
        """{"input_ids", "token_type_ids", "target_ids"} per example (every example: an unanswerable SQuAD 2.0
        question is trained to write only EOS)."""
        self.tokenizer = tokenizer
        split = "train" if training else "dev"
        sources, cut_inputs = self._encode([self.source(e) for e in examples], self.max_input_length, tokenizer)
        targets, cut_targets = self._encode([self.target(e) for e in examples], self.max_target_length, tokenizer)
        record = self.stats.setdefault(split, {})
        record.update(examples=len(examples), inputs_truncated=len(cut_inputs), targets_truncated=len(cut_targets),
                      max_seq_length=self.max_input_length, max_target_length=self.max_target_length)
        if cut_targets:
            first = examples[cut_targets[0]]
            where = f"line {first.line}" if hasattr(first, "line") else f"question {first.id}"
            print(f"{self.paths.get(training, split)}: {len(cut_targets)} of {len(examples)} targets are longer than "
                  f"max_target_length {self.max_target_length} (tokens, EOS included) and were cut (first: {where}); "
                  f"counted in results.json; raise --max-target-length to keep them whole", file=sys.stderr,
                  flush=True)
        return [{"input_ids": s, "token_type_ids": [0] * len(s), "target_ids": t} for s, t in zip(sources, targets)]

    def objective(self):
        return Seq2SeqTask()

    # ---- evaluation ------------------------------------------------------------------------------------------
    def label_of(self) -> dict[str, str]:
        """generated text -> label: each target word, as written and as the tokenizer gives it back (normalised,
        e.g. NFKC and single spaces, for T5's Unigram), so a model that writes its target exactly is understood."""
        out = {}
        for label, word in self.words.items():
            out[word] = label
            if self.tokenizer is not None:
                out.setdefault(self.tokenizer.decode(list(self.tokenizer.encode_raw([word])[0].ids)).strip(), label)
        return out

    def decode(self, generated: Sequence[np.ndarray]) -> list[str]:
        """Generated token ids -> texts (special tokens dropped, outer spaces stripped)."""
        if self.tokenizer is None:
            raise RuntimeError("features() or prediction_features() gives the family its tokenizer first")
        return [self.tokenizer.decode([int(i) for i in ids]).strip() for ids in generated]

    def interpret(self, texts: list[str]) -> tuple[list[Any], int]:
        """(what each text says, how many say nothing valid): for labels the file's label or the text itself (as
        one line), for scores a float (-1.0 when unparsable), for SQuAD the text."""
        if self.kind == "squad":
            return list(texts), 0
        if self.regression:
            values = [parse_score(t) for t in texts]
            return [-1.0 if v is None else v for v in values], sum(v is None for v in values)
        labels = self.label_of()
        out = [labels.get(t, one_line(t)) for t in texts]
        return out, sum(t not in labels for t in texts)

    def evaluate(self, examples, features, generated) -> tuple[dict[str, Any], Any]:
        texts = self.decode(generated)
        values, unrecognized = self.interpret(texts)
        if self.kind == "squad":
            predictions = {e.id: text for e, text in zip(examples, texts)}
            return squad_evaluate(examples, predictions, None, self.base.version_2), predictions
        if self.regression:
            written = [f"{v:.6g}" for v in values]  # what the predictions file holds, scored as read back
            metrics = self.base.score(None, [float(w) for w in written], [e.label for e in examples], None)
        else:
            written = values
            metrics = self.base.score(None, written, [e.label for e in examples], None)
        return {**metrics, "unrecognized": unrecognized}, written

    def write_predictions(self, out_dir: Path, examples, output) -> None:
        if self.kind == "squad":
            write_squad_predictions(Path(out_dir) / "predictions.json", output)
            return
        (Path(out_dir) / "dev_predictions.txt").write_text("".join(f"{x}\n" for x in output), encoding="utf-8")

    def task_info(self) -> dict[str, Any]:
        c = self.config
        info = {"kind": self.kind, "task": c.task, "text_to_text": True, "max_seq_length": self.max_input_length,
                "max_target_length": self.max_target_length, "labels": self.labels, "regression": self.regression}
        if self.kind == "classify":
            info.update(text_column=c.text_column, pair_column=c.pair_column)
        if self.kind == "squad":
            info["version_2"] = self.base.version_2
        return info

    # ---- a fine-tuned model ----------------------------------------------------------------------------------
    def restore(self, info: dict[str, Any], model) -> None:
        self.labels = info.get("labels")
        self.base.labels = self.labels
        self.regression = bool(info.get("regression", False))
        if self.kind == "squad":
            self.base.version_2 = bool(info.get("version_2", False))

    def prediction_features(self, inputs: Sequence, tokenizer) -> list[dict[str, Any]]:
        """inputs: texts or (text, pair) tuples (glue, classify); (question, context) tuples (squad)."""
        self.tokenizer = tokenizer
        if self.kind == "squad":
            examples = [SquadExample(id=str(i), question=q, context=c, answers=[], is_impossible=False)
                        for i, (q, c) in enumerate(inputs)]
        else:
            examples = [Example(x, p, None, 0) for x, p in zip(*texts_and_pairs(inputs))]
        sources, _ = self._encode([self.source(e) for e in examples], self.max_input_length, tokenizer)
        return [{"input_ids": s, "token_type_ids": [0] * len(s)} for s in sources]

    def predictions(self, inputs, features, generated, top_k: int | None = None) -> list[dict[str, Any]]:
        """One dict per input with the generated "text": classify/glue {"label" (None when the text is no label),
        "text"}; regression {"score" (None when it is no number), "text"}; squad {"answer", "text"}."""
        texts = self.decode(generated)
        if self.kind == "squad":
            return [{"answer": t, "text": t} for t in texts]
        if self.regression:
            return [{"score": parse_score(t), "text": t} for t in texts]
        labels = self.label_of()
        return [{"label": labels.get(t), "text": t} for t in texts]

    def evaluate_file(self, data_path, predictions_path, null_odds_path=None) -> dict[str, Any]:
        return self.base.evaluate_file(data_path, predictions_path, null_odds_path)
