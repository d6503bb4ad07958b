"""T5 span-corruption pretraining: the "spans" stream (every token once across input and target, lengths from
random_spans_helper, a generator per instance), the inverse-square-root schedule, the recipes, the loss falling on a
tiny corpus, exact resume, and the errors for a tokenizer without sentinels (gloo processes:
tests/training/test_pretrain_every_row.py)."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.data.corpus import iter_lines
from bertkit.data.instances import ListDocuments, SpecialIds
from bertkit.data.loader import PretrainingStream, StreamOptions
from bertkit.data.prepare import prepare
from bertkit.data.spans import random_spans_helper, split_tokens
from bertkit.training.pretrain import pretrain, resolve_config, stream_options
from bertkit.tokenizers import UnigramTokenizer, WordPieceTokenizer
from bertkit.training.trainer import TrainConfig, learning_rate

WORDS = ("the a cat dog bird sees likes chases eats small big red green quick slow happy sad house tree river "
         "park runs sleeps sings under over near with and but because").split()
VOCAB, EOS, PAD = 200, 1, 0
FIRST_SENTINEL = VOCAB - 1
LENGTH = 40  # corrupted input length of the stream tests: 3 noise spans per full sequence


def corpus_file(path: Path, documents: int, seed: int) -> Path:
    """Documents of short sentences, a blank line between documents."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(documents):
        topic = str(rng.choice(WORDS))
        for _ in range(int(rng.integers(3, 8))):
            lines.append(" ".join([topic] + [str(w) for w in rng.choice(WORDS, int(rng.integers(4, 12)))]) + ".")
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def uncorrupt(inputs: np.ndarray, targets: np.ndarray, first_sentinel: int) -> list[int]:
    """The tokens before corruption: each sentinel of the input replaced by what follows it in the target."""
    spans: dict[int, list[int]] = {}
    current = None
    for t in targets.tolist():
        if t == EOS:
            break
        if t > first_sentinel - 50:  # a sentinel (the vocabulary's last ids)
            current = spans.setdefault(t, [])
        else:
            current.append(t)
    out: list[int] = []
    for t in inputs.tolist():
        if t == EOS:
            break
        out.extend(spans[t] if t in spans else [t])
    return out


def span_stream(docs, max_seq_length: int = LENGTH, batch: int = 4, seed: int = 3) -> PretrainingStream:
    options = StreamOptions(instances="spans", max_seq_length=max_seq_length, chunk_docs=4,
                            first_sentinel_id=FIRST_SENTINEL, sentinels=40)
    special = SpecialIds(cls=None, sep=EOS, pad=PAD, mask=None)
    return PretrainingStream(docs, options, special, VOCAB, batch, seed=seed, prefetch=0)


@pytest.fixture(scope="module")
def docs() -> ListDocuments:
    rng = np.random.default_rng(0)
    return ListDocuments([[rng.integers(5, 150, int(rng.integers(3, 15))) for _ in range(int(rng.integers(1, 5)))]
                          for _ in range(21)])


# ---- the stream ------------------------------------------------------------------------------------------------
def test_split_tokens_concatenates_documents_and_cuts_segments():
    parts = split_tokens([np.array([1, 2, 3]), np.array([], dtype=np.int64), np.array([4, 5, 6, 7])], 3)
    assert [p.tolist() for p in parts] == [[1, 2, 3], [4, 5, 6], [7]]
    assert split_tokens([], 5) == []
    with pytest.raises(ValueError, match="tokens_length"):
        split_tokens([np.array([1])], 0)


def test_span_batches_hold_every_token_once_at_t5_lengths(docs):
    """An epoch's sequences, corrupted and collated: inputs and targets end with EOS, sentinels count down from the
    last id, full sequences come out at random_spans_helper's lengths, and input + target give back every token of
    the corpus exactly once."""
    stream = span_stream(docs)
    tokens_length, targets_length = random_spans_helper(LENGTH)
    items = []
    for inst, epoch, index, _ in stream.instances():
        if epoch > 0:
            break
        items.append((inst, epoch, index))
    seen: list[int] = []
    full_rows = 0
    for start in range(0, len(items), 4):
        batch = stream.collate(items[start:start + 4])
        ids, mask, labels = batch["input_ids"].numpy(), batch["attention_mask"].numpy(), batch["labels"].numpy()
        assert ids.shape[1] <= LENGTH and labels.shape[1] <= targets_length
        for row in range(ids.shape[0]):
            n_in, n_out = int(mask[row].sum()), int((labels[row] != -100).sum())
            inputs, targets = ids[row, :n_in], labels[row, :n_out]
            assert inputs[-1] == EOS and targets[-1] == EOS and (ids[row, n_in:] == PAD).all()
            original = uncorrupt(inputs, targets, FIRST_SENTINEL)
            assert original == items[start + row][0].input_ids.tolist()
            seen.extend(original)
            if len(original) == tokens_length:  # a full sequence: exactly T5's input and target lengths
                full_rows += 1
                assert (n_in, n_out) == (LENGTH, targets_length)
            sentinels = [t for t in inputs.tolist() if t > 150]
            assert len(sentinels) >= 1
            assert sentinels == list(range(FIRST_SENTINEL, FIRST_SENTINEL - len(sentinels), -1))
    corpus = [int(t) for i in range(len(docs)) for sentence in docs.document(i)[0] for t in sentence]
    assert full_rows >= len(items) // 2 and sorted(seen) == sorted(corpus)


def test_each_sequence_has_its_own_generator(docs):
    """A sequence is corrupted alike whatever batch it lands in (the generator flows from seed, epoch and index),
    so a resumed or re-sharded run corrupts it identically; another seed corrupts it otherwise."""
    items = [(inst, epoch, index) for inst, epoch, index, _ in itertools.islice(span_stream(docs).instances(), 8)]
    four = span_stream(docs, batch=4)
    whole = four.collate(items)
    halves = [four.collate(items[:4]), four.collate(items[4:])]
    for row in range(8):
        half = halves[row // 4]
        a = whole["input_ids"][row][whole["attention_mask"][row] == 1]
        b = half["input_ids"][row % 4][half["attention_mask"][row % 4] == 1]
        assert torch.equal(a, b)
    other = span_stream(docs, seed=4).collate(items)
    assert not torch.equal(other["input_ids"], whole["input_ids"])
    ranks = [span_stream(docs, batch=2) for _ in range(2)]
    for r, s in enumerate(ranks):
        s.rank, s.world_size = r, 2
    firsts = [next(iter(s._batches())) for s in ranks]
    single = next(iter(span_stream(docs, batch=4)._batches()))
    assert torch.equal(torch.cat([firsts[0]["labels"], firsts[1]["labels"]]), single["labels"])


def test_tokenizers_without_enough_sentinels_are_refused(tmp_path):
    from bertkit.training.pretrain import DataConfig

    data = DataConfig(objective="t5", max_seq_length=64)
    wordpiece = WordPieceTokenizer.train(WORDS, vocab_size=60, min_frequency=1, show_progress=False)
    with pytest.raises(ValueError, match=r"tok/: the wordpiece tokenizer has no sentinel tokens <extra_id_0>"):
        stream_options(data, wordpiece, "tok/")
    none = UnigramTokenizer.train(WORDS * 3, vocab_size=80, extra_ids=0, show_progress=False)
    with pytest.raises(ValueError, match="no sentinel tokens"):
        stream_options(data, none, "tok/")
    few = UnigramTokenizer.train(WORDS * 3, vocab_size=80, extra_ids=2, show_progress=False)
    with pytest.raises(ValueError, match=r"tok/: span corruption at max_seq_length 64 cuts up to 3 spans per "
                                         r"sequence, but there are only 2 sentinel tokens"):
        stream_options(data, few, "tok/")
    enough = UnigramTokenizer.train(WORDS * 3, vocab_size=80, extra_ids=3, show_progress=False)
    options = stream_options(data, enough, "tok/")
    assert (options.first_sentinel_id, options.sentinels) == (enough.vocab_size - 1, 3)


# ---- schedule and recipes --------------------------------------------------------------------------------------
def test_inverse_sqrt_schedule_is_t5s():
    config = TrainConfig(schedule="inverse_sqrt", learning_rate=0.01, warmup_steps=100, max_steps=1000)
    assert [learning_rate(config, s, 0.0) for s in (0, 50, 100)] == [0.01] * 3
    assert learning_rate(config, 400, 0.0) == pytest.approx(0.01 * 0.5)
    assert learning_rate(config, 10_000, 0.0) == pytest.approx(0.001)
    longer = TrainConfig(schedule="inverse_sqrt", learning_rate=0.01, warmup_steps=100, max_steps=10**6,
                         max_time=5.0)
    assert learning_rate(longer, 400, 99.0) == learning_rate(config, 400, 0.0)  # no budget in it
    with pytest.raises(ValueError, match="schedule must be one of linear, inverse_sqrt"):
        TrainConfig(schedule="cosine")


def test_recipes_and_the_objective_choose_t5():
    base = resolve_config("t5-base")
    assert base.model["model_type"] == "t5" and base.preset == "base" and base.data.objective == "t5"
    assert base.data.max_seq_length == 512 and base.data.mask_prob == 0.15 and base.data.mean_noise_span_length == 3
    assert base.train.max_steps == 2**19 and base.train.schedule == "inverse_sqrt" and base.train.warmup_steps == 10**4
    assert base.data.batch_size * base.train.grad_accumulation == 128
    mini = resolve_config("t5-mini")
    assert mini.model["model_type"] == "t5" and mini.train.schedule == "inverse_sqrt"
    alone = resolve_config(None, {"objective": "t5", "d_model": "64", "num_heads": "2"})
    assert alone.model == {"d_model": 64, "num_heads": 2}
    from bertkit.training.pretrain import build_pretraining_model

    model = build_pretraining_model(alone, 300)[0]
    assert type(model).__name__ == "T5ForConditionalGeneration" and model.config.d_model == 64
    with pytest.raises(ValueError, match="objective 'roberta' with model_type 't5'"):
        resolve_config("t5-mini", {"objective": "roberta"})


# ---- training end to end ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def t5_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("t5pretrain")
    corpus = corpus_file(root / "corpus.txt", 50, 0)
    held_out = corpus_file(root / "held_out.txt", 8, 1)
    tok = UnigramTokenizer.train(iter_lines([corpus]), vocab_size=200, extra_ids=100, show_progress=False)
    tok.save(root / "tok")
    prepare([corpus], root / "tok", root / "data", eval_paths=[held_out], progress=False)
    return root / "data"


TINY = {"d_model": "32", "d_kv": "8", "d_ff": "64", "num_layers": "2", "num_heads": "4", "max_seq_length": "32",
        "batch_size": "8", "eval_instances": "24", "progress": "false", "log_every": "1", "eval_every": "0",
        "learning_rate": "3e-3", "warmup_steps": "4"}


def metrics(run: Path, key: str = "loss") -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r[key] for r in records if key in r}


def test_loss_falls_and_the_directory_loads_in_transformers(t5_data, tmp_path):
    from bertkit.cli import main

    run = tmp_path / "run"
    args = ["pretrain", "--data", str(t5_data), "--out", str(run), "--config", "t5-mini", "--max-steps", "120",
            "--save-every", "60"]
    for key, value in TINY.items():
        args += [f"--{key.replace('_', '-')}", value]
    assert main(args) == 0
    curve = metrics(run)
    first, last = np.mean([curve[s] for s in range(1, 11)]), np.mean([curve[s] for s in range(111, 121)])
    assert last < first - 1.0, (first, last)
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "eval_span" in line]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 120
    assert evals[-1]["eval_span_accuracy"] > evals[0]["eval_span_accuracy"] + 0.2
    assert evals[-1]["eval_perplexity"] == pytest.approx(np.exp(evals[-1]["eval_span_loss"]), rel=1e-6)
    config = (run / "config.yaml").read_text()
    assert "objective: t5" in config and "schedule: inverse_sqrt" in config
    transformers = pytest.importorskip("transformers")
    from bertkit.models import T5ForConditionalGeneration

    ours = T5ForConditionalGeneration.from_pretrained(run / "model").eval()
    theirs, info = transformers.T5ForConditionalGeneration.from_pretrained(str(run / "model"),
                                                                           output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = torch.randint(2, ours.config.vocab_size, (2, 9))
    labels = torch.randint(2, ours.config.vocab_size, (2, 5))
    a = ours(ids, torch.ones_like(ids), labels=labels).logits
    b = theirs.eval()(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).logits
    assert torch.allclose(a, b, atol=1e-5)


def test_stopped_and_resumed_run_repeats_every_loss(t5_data, tmp_path):
    """Stopped after 4 steps (as a run with a shorter budget) and resumed to 8: the per-step losses and the final
    weights of one uninterrupted 8-step run, dropout draws and span corruption included (the inverse-square-root
    schedule does not depend on the budget)."""
    settings = {**TINY, "dropout_rate": "0.1", "save_every": "2", "masking": "dynamic"}
    whole = pretrain(t5_data, tmp_path / "whole", resolve_config("t5-mini", {**settings, "max_steps": "8"}))
    half = pretrain(t5_data, tmp_path / "half", resolve_config("t5-mini", {**settings, "max_steps": "4"}))
    assert (whole.step, half.step) == (8, 4)
    torch.manual_seed(123)  # whatever the process did since: the checkpoint's RNG states are restored
    pretrain(t5_data, tmp_path / "half", resolve_config("t5-mini", {**settings, "max_steps": "8"}), resume=True)
    assert metrics(tmp_path / "half") == metrics(tmp_path / "whole") and len(metrics(tmp_path / "whole")) == 8
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / run / "model" / "model.safetensors")) for run in ("whole", "half"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_pretraining_on_wordpiece_shards_is_refused(tmp_path):
    from bertkit.cli import main

    corpus = corpus_file(tmp_path / "c.txt", 6, 0)
    tok = WordPieceTokenizer.train(iter_lines([corpus]), vocab_size=80, min_frequency=1, show_progress=False)
    tok.save(tmp_path / "tok")
    prepare([corpus], tmp_path / "tok", tmp_path / "data", progress=False)
    args = ["pretrain", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "run"), "--objective", "t5"]
    for key, value in TINY.items():
        args += [f"--{key.replace('_', '-')}", value]
    with pytest.raises(ValueError, match="has no sentinel tokens"):
        with_debug(main, args)


def with_debug(main, args):
    """Run the CLI with BERTKIT_DEBUG=1, so that its error comes out as the exception."""
    os.environ["BERTKIT_DEBUG"] = "1"
    try:
        return main(args)
    finally:
        del os.environ["BERTKIT_DEBUG"]
