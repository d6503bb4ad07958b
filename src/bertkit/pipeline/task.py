"""The main job's built-in labelled task, made from the standard library's documentation sentences.

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

import collections
import json
import os
import random
import re
import sysconfig
from pathlib import Path
from typing import Any, Callable

from bertkit.pipeline.corpus import python_files, prose_sentences


# The built-in task's candidate classes: standard-library packages with distinct subjects and a few hundred prose
# sentences each in CPython 3.10-3.13 (a package this Python lacks, or one with too few sentences, is left out).
TASK_PACKAGES = ("asyncio", "email", "http", "importlib", "logging", "tkinter", "unittest", "xml")
TASK_TRAIN_PER_CLASS = 400
TASK_DEV_PER_CLASS = 100
TASK_MIN_PER_CLASS = 150
WORD_ORDER_TRAIN = 3000  # the built-in task's training sentences at most (the curve's last point)
WORD_ORDER_DEV = 1500  # and its dev sentences (at most a third of them): a large dev set keeps its own noise small


def _package_sentences(root: Path, packages: tuple[str, ...]) -> dict[str, list[str]]:
    """{package: its prose sentences in file order} for the packages (or top-level modules) of `packages` under
    `root`; a package that is not there has none."""
    by_package: dict[str, list[str]] = {}
    for name in packages:
        files = sorted(python_files(root / name)) if (root / name).is_dir() else (
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
