"""bertkit.pipeline.task: the built-in tasks from documentation sentences, the random words and the shuffles."""

from __future__ import annotations

import collections
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit.pipeline.corpus import default_corpus, prose_sentences
from bertkit.pipeline.task import (build_docstring_task, build_word_order_task, build_word_salad_task, plain_words,
                                   random_words, shuffle_words)

def _fake_stdlib(root: Path) -> Path:
    """alpha/ (two files) and beta.py with enough prose each, gamma/ with too little; one sentence in both."""
    def module(path: Path, topic: str, n: int, shared: bool = False):
        path.parent.mkdir(parents=True, exist_ok=True)
        sentences = [f"The {topic} helper number {i} returns a {topic} value for the caller." for i in range(n)]
        if shared:
            sentences.append("This sentence is written in two packages at once.")
        path.write_text('"""' + " ".join(sentences) + '"""\n', encoding="utf-8")

    module(root / "alpha" / "__init__.py", "alpha", 30, shared=True)
    module(root / "alpha" / "sub.py", "alphasub", 30)
    module(root / "alpha" / "tests" / "test_x.py", "ignored", 30)  # test folders are not read
    module(root / "beta.py", "beta", 40, shared=True)
    module(root / "gamma" / "__init__.py", "gamma", 5)
    return root


def test_builtin_task_from_docstrings(tmp_path):
    root = _fake_stdlib(tmp_path / "lib")
    info = build_docstring_task(tmp_path / "task", seed=3, stdlib=root, packages=("alpha", "beta", "gamma"),
                                train_per_class=30, dev_per_class=10, min_per_class=20)
    assert info["labels"] == ["alpha", "beta"]  # gamma has too few sentences
    assert info["per_class"] == {"alpha": [30, 10], "beta": [30, 8]}  # beta: a fifth of its 40 for dev
    train = [json.loads(line) for line in Path(info["train"]).read_text().splitlines()]
    dev = [json.loads(line) for line in Path(info["dev"]).read_text().splitlines()]
    assert len(train) == info["train_examples"] == 60 and len(dev) == info["dev_examples"] == 18
    texts = [r["text"] for r in train + dev]
    assert len(set(texts)) == len(texts)  # no sentence twice, none in both splits
    assert not any("two packages" in t or "ignored" in t for t in texts)
    assert all(r["text"].split()[1].startswith(r["label"]) for r in train + dev)  # labelled by where it lives
    assert info["dev_sentences"] == [r["text"] for r in dev]
    again = build_docstring_task(tmp_path / "again", seed=3, stdlib=root, packages=("alpha", "beta", "gamma"),
                                 train_per_class=30, dev_per_class=10, min_per_class=20)
    assert Path(again["dev"]).read_text() == Path(info["dev"]).read_text()  # seeded
    from bertkit.tasks.finetune import FinetuneConfig
    from bertkit.tasks.classify import ClassificationFamily

    family = ClassificationFamily(FinetuneConfig(kind="classify"))
    assert [e.label for e in family.read(info["train"], training=True)] == [r["label"] for r in train]

    # The pretraining corpus keeps the task's training sentences and leaves its dev sentences out.
    corpus = default_corpus(tmp_path / "corpus.txt", progress=False, exclude=set(info["dev_sentences"]), roots=[root])
    lines = set(corpus.read_text().splitlines())
    assert not lines & set(info["dev_sentences"])
    assert {r["text"] for r in train} <= lines
    assert len(lines - {""}) == sum(len(prose_sentences(p)) for p in root.rglob("*.py")
                                    if "tests" not in p.parts) - len(dev) - 1  # the shared sentence: one line
    # Parsed in one process or in several, the corpus is the same file (written in the files' order).
    alone = default_corpus(tmp_path / "alone.txt", progress=False, exclude=set(info["dev_sentences"]), roots=[root],
                           processes=1)
    pooled = default_corpus(tmp_path / "pooled.txt", progress=False, exclude=set(info["dev_sentences"]),
                            roots=[root], processes=3)
    assert alone.read_bytes() == pooled.read_bytes() == corpus.read_bytes()
    # Out of time: it stops once it has two documents (modules), whatever is left.
    quick = default_corpus(tmp_path / "quick.txt", progress=False, roots=[root], max_seconds=0.0)
    assert quick.read_text().count("\n\n") == 2 and len(quick.read_text()) < len(corpus.read_text())


def test_word_order_task_from_docstrings(tmp_path):
    root = _fake_stdlib(tmp_path / "lib")
    info = build_word_order_task(tmp_path / "task", seed=5, stdlib=root, packages=("alpha", "beta", "gamma"),
                                 train_max=60, dev_count=30)
    train = [json.loads(line) for line in Path(info["train"]).read_text().splitlines()]
    dev = [json.loads(line) for line in Path(info["dev"]).read_text().splitlines()]
    # 106 distinct sentences of 6 to 40 words (alpha 30 + 30, beta 40, gamma 5, the shared one once; the 30 under
    # tests/ are not read): dev takes 30 of them (each as written and shuffled), training the next 60.
    assert (len(train), len(dev)) == (info["train_examples"], info["dev_examples"]) == (60, 60)
    for rows in (train, dev):
        assert sorted(collections.Counter(r["label"] for r in rows).values()) == [len(rows) // 2] * 2
        assert all(r["text"][-1].isalnum() and r["text"][0].isalnum() for r in rows)  # no mark of the end
    # Paired dev: each sentence as written, then its shuffled copy.
    assert [r["label"] for r in dev] == ["original", "shuffled"] * 30
    assert all(sorted(a["text"].split()) == sorted(b["text"].split()) for a, b in zip(dev[::2], dev[1::2]))
    written = {" ".join(plain_words(s)): s for p in root.rglob("*.py") if "tests" not in p.parts
               for s in prose_sentences(p)}
    for r in train + dev:
        if r["label"] == "original":
            assert r["text"] in written
        else:  # the same words as a sentence of the packages, in another order
            assert r["text"] not in written
            assert any(sorted(r["text"].split()) == sorted(k.split()) for k in written)
    originals = [written.get(r["text"]) for r in dev]
    assert set(info["dev_sentences"]) >= {o for o in originals if o}  # kept out of pretraining as written
    assert not set(info["dev_sentences"]) & {written[r["text"]] for r in train if r["label"] == "original"}
    again = build_word_order_task(tmp_path / "again", seed=5, stdlib=root, packages=("alpha", "beta", "gamma"),
                                  train_max=60, dev_count=30)
    assert Path(again["train"]).read_text() == Path(info["train"]).read_text()  # seeded
    with pytest.raises(RuntimeError, match="fewer than 100"):
        build_word_order_task(tmp_path / "few", stdlib=root, packages=("gamma",))


def test_word_salad_task_from_docstrings(tmp_path):
    root = _fake_stdlib(tmp_path / "lib")
    info = build_word_salad_task(tmp_path / "task", seed=5, stdlib=root, packages=("alpha", "beta", "gamma"),
                                 train_max=60, dev_count=30)
    assert info["name"] == "word-salad" and info["labels"] == ["random", "written"]
    train = [json.loads(line) for line in Path(info["train"]).read_text().splitlines()]
    dev = [json.loads(line) for line in Path(info["dev"]).read_text().splitlines()]
    # 106 distinct sentences of 6 to 40 words (alpha 30 + 30, beta 40, gamma 5, the shared one once; the 30 under
    # tests/ are not read): dev takes 30 of them (each as written and as a random row), training the next 60.
    assert (len(train), len(dev)) == (info["train_examples"], info["dev_examples"]) == (60, 60)
    for rows in (train, dev):
        assert sorted(collections.Counter(r["label"] for r in rows).values()) == [len(rows) // 2] * 2
    assert [r["label"] for r in dev] == ["written", "random"] * 30  # paired: a sentence, then its random row
    # A random row is as long as the sentence it replaces.
    assert all(len(a["text"].split()) == len(b["text"].split()) for a, b in zip(dev[::2], dev[1::2]))
    written = {" ".join(plain_words(s)): s for p in root.rglob("*.py") if "tests" not in p.parts
               for s in prose_sentences(p)}
    dev_sentences = set(info["dev_sentences"])
    assert len(dev_sentences) == 30 and dev_sentences <= set(written.values())
    assert {written[r["text"]] for r in dev if r["label"] == "written"} == dev_sentences  # dev rows: dev sentences
    assert not dev_sentences & {written[r["text"]] for r in train if r["label"] == "written"}
    # A random row's words are drawn from its own split's sentences: dev ones only from the dev sentences, which
    # pretraining never sees, training ones never from them (the numbers 0-39 tell the sentences apart here).
    dev_words = {w for s in dev_sentences for w in plain_words(s)}
    train_words = {w for s in set(written.values()) - dev_sentences for w in plain_words(s)}
    for r in dev:
        if r["label"] == "random":
            assert r["text"] not in written and set(r["text"].split()) <= dev_words
    for r in train:
        if r["label"] == "random":
            assert r["text"] not in written and set(r["text"].split()) <= train_words
    # The pipeline's corpus leaves the dev sentences out and keeps the training ones.
    corpus = default_corpus(tmp_path / "corpus.txt", progress=False, exclude=dev_sentences, roots=[root])
    lines = set(corpus.read_text().splitlines())
    assert not lines & dev_sentences
    assert {written[r["text"]] for r in train if r["label"] == "written"} <= lines
    again = build_word_salad_task(tmp_path / "again", seed=5, stdlib=root, packages=("alpha", "beta", "gamma"),
                                  train_max=60, dev_count=30)
    assert Path(again["train"]).read_text() == Path(info["train"]).read_text()  # seeded
    other = build_word_salad_task(tmp_path / "other", seed=6, stdlib=root, packages=("alpha", "beta", "gamma"),
                                  train_max=60, dev_count=30)
    assert Path(other["train"]).read_text() != Path(info["train"]).read_text()
    with pytest.raises(RuntimeError, match="fewer than 100"):
        build_word_salad_task(tmp_path / "few", stdlib=root, packages=("alpha", "gamma"))


def test_word_salad_and_word_order_tasks_share_their_sentences(tmp_path):
    # The same seed gives both tasks the same split, so a run's kept models (whose pretraining left out one task's
    # dev sentences) can be screened on the other (bench/experiments/task_candidates.py relies on it).
    root = _fake_stdlib(tmp_path / "lib")
    kw = dict(seed=2, stdlib=root, packages=("alpha", "beta", "gamma"), train_max=60, dev_count=30)
    assert (build_word_salad_task(tmp_path / "s", **kw)["dev_sentences"]
            == build_word_order_task(tmp_path / "o", **kw)["dev_sentences"])


def test_random_words_draw_by_frequency_from_other_sentences():
    # Sentence 0 owns "c" x4, sentence 1 owns "a" x3 and "b" x1: drawing for sentence 0 gives "a" with probability
    # 3/4. Over 4,000 draws the binomial standard deviation of the share is sqrt(0.75 * 0.25 / 4000) = 0.0068;
    # the bound is four of them.
    pool, owner = ["c"] * 4 + ["a", "a", "b", "a"], [0] * 4 + [1] * 4
    drawn = random_words(4000, pool, owner, 0, random.Random(0))
    assert set(drawn) == {"a", "b"} and abs(drawn.count("a") / 4000 - 0.75) < 4 * 0.0068
    assert random_words(3, pool, owner, 7, random.Random(0)) == random_words(3, pool, owner, 7, random.Random(0))
    with pytest.raises(ValueError, match="another sentence"):
        random_words(1, ["x", "y"], [3, 3], 3, random.Random(0))


@given(st.lists(st.tuples(st.sampled_from("abcdefg"), st.integers(0, 3)), min_size=1, max_size=30),
       st.integers(0, 3), st.integers(0, 20), st.integers(0, 1000))
@settings(max_examples=200, deadline=None)
def test_random_words_never_take_a_sentences_own_words(occurrences, own, count, seed):
    pool, owner = [w for w, _ in occurrences], [o for _, o in occurrences]
    allowed = {w for w, o in occurrences if o != own}
    if not allowed:
        with pytest.raises(ValueError):
            random_words(count, pool, owner, own, random.Random(seed))
        return
    drawn = random_words(count, pool, owner, own, random.Random(seed))
    assert len(drawn) == count and set(drawn) <= allowed


def test_plain_words_and_shuffle_words():
    assert plain_words("(See below). Then: it's done -- e.g. x_y!") == ["See", "below", "Then", "it's", "done",
                                                                         "e.g", "x_y"]
    rng = random.Random(0)
    words = "a b c d".split()
    for _ in range(50):
        shuffled = shuffle_words(words, rng)
        assert shuffled != words and sorted(shuffled) == words
    assert shuffle_words(["a", "a", "b"], rng) != ["a", "a", "b"]
    with pytest.raises(ValueError):
        shuffle_words(["a", "a"], rng)
