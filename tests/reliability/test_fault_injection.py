"""The fault-injection campaign (`pytest -m slow`): SIGKILL at random moments of `prepare`, `pretrain`, `finetune`
and `distill`, each followed by a re-run until the job finishes, must end bit-identical to an uninterrupted run; writers started at
the same moment on one directory leave exactly one winner and a one-line refusal.

The kill points are random on purpose (a new draw each run, printed with the seed for replay:
BERTKIT_FAULT_SEED=N); BERTKIT_FAULT_KILLS sets how many kills each test makes (default 20).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from reliability_helpers import (bertkit_command, losses, one_error_line, pretrain_argv, subprocess_env,
                                 synthetic_corpus, training_records)

from bertkit import WordPieceTokenizer
from bertkit.data.corpus import iter_lines
from bertkit.data.manifest import MANIFEST
from bertkit.data.prepare import prepare
from bertkit.io import LOCK_NAME

pytestmark = pytest.mark.slow

KILLS = int(os.environ.get("BERTKIT_FAULT_KILLS", "20"))


@pytest.fixture(scope="module")
def rng() -> random.Random:
    seed = int(os.environ.get("BERTKIT_FAULT_SEED", str(random.SystemRandom().randrange(2 ** 32))))
    print(f"\nfault-injection seed {seed} (BERTKIT_FAULT_SEED={seed} replays these kill points)")
    return random.Random(seed)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    """(a corpus large enough that `prepare` takes a few seconds over many shards, its tokenizer directory)."""
    root = tmp_path_factory.mktemp("faults")
    text = synthetic_corpus(root / "corpus.txt", documents=6000, seed=3)
    tok = WordPieceTokenizer.train(iter_lines([text]), vocab_size=120, min_frequency=1, show_progress=False)
    tok.save(root / "tok")
    return text, root / "tok"


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` by relative path, with its bytes (lock files aside)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != LOCK_NAME}


def timed_run(argv: list[str]) -> float:
    """Run `bertkit argv` to the end (it must succeed); its wall time in seconds."""
    start = time.perf_counter()
    result = subprocess.run(bertkit_command(*argv), env=subprocess_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return time.perf_counter() - start


def campaign(command, rng: random.Random, kills: int, duration: float, check) -> int:
    """SIGKILL `bertkit command(out)` at random moments until `kills` kills have hit a running process.

    Episodes: each starts on a new output directory `out` and re-runs the command after every kill (at a time
    drawn uniformly over `duration`, the uninterrupted run's wall time) until a run ends by itself; then
    `check(out)` compares the result with the uninterrupted run's. Returns the number of episodes."""
    hits, episodes = 0, 0
    while hits < kills:
        assert episodes < 3 * kills, f"only {hits} kills hit a running process in {episodes} episodes"
        out_of = f"episode-{episodes}"
        while True:
            proc = subprocess.Popen(bertkit_command(*command(out_of)), env=subprocess_env(),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                proc.wait(timeout=rng.uniform(0.05, duration))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                hits += 1
                continue
            finally:
                err = proc.stderr.read()
                proc.stderr.close()
            assert proc.returncode == 0, err[-3000:]
            break
        check(out_of)
        episodes += 1
    return episodes


def test_sigkill_at_random_points_of_prepare(corpus, tmp_path, rng):
    text, tok = corpus
    reference = tmp_path / "reference"

    def command(out: str) -> list[str]:
        return ["prepare", "--corpus", str(text), "--tokenizer", str(tok), "--out", str(tmp_path / out), "--quiet",
                "--shard-tokens", "20000", "--eval-fraction", "0.05"]

    duration = timed_run(command("reference"))
    assert len(list((reference / "train").glob("*.tokens.bin"))) >= 8
    expected = tree(reference)

    def check(out: str) -> None:  # every shard, record, tokenizer file and the manifest, byte for byte
        assert tree(tmp_path / out) == expected

    episodes = campaign(command, rng, KILLS, duration, check)
    print(f"prepare: {KILLS} kills over {episodes} episodes, each ending identical to the uninterrupted run")


def test_sigkill_at_random_points_of_pretrain(corpus, tmp_path, rng):
    text, tok = corpus
    data = tmp_path / "data"
    prepare([text], tok, data, progress=False, eval_fraction=0.02)
    settings = dict(max_steps=120, save_every=4, log_every=2, batch_size=16)
    reference = tmp_path / "reference"

    def command(out: str) -> list[str]:
        return pretrain_argv(data, tmp_path / out, "--resume", **settings)

    duration = timed_run(command("reference"))
    records, weights = training_records(reference), (reference / "model" / "model.safetensors").read_bytes()

    def check(out: str) -> None:
        run = tmp_path / out
        assert training_records(run) == records  # every logged step, bit for bit
        assert losses(run, "eval_mlm_loss") == losses(reference, "eval_mlm_loss")
        assert (run / "model" / "model.safetensors").read_bytes() == weights
        assert sorted(p.name for p in run.rglob(".*") if p.name != LOCK_NAME) == []  # nothing half-written

    episodes = campaign(command, rng, KILLS, duration, check)
    print(f"pretrain: {KILLS} kills over {episodes} episodes, each ending identical to the uninterrupted run")


@pytest.fixture(scope="module")
def teacher(corpus, tmp_path_factory) -> Path:
    """A tiny BertForPreTraining directory with the corpus's vocabulary (a model to fine-tune and a teacher)."""
    import torch

    from bertkit import BertConfig, BertForPreTraining
    from bertkit.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(corpus[1])
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, initializer_range=0.1)
    out = tmp_path_factory.mktemp("teacher") / "model"
    BertForPreTraining(config).save_pretrained(out, tokenizer=tokenizer)
    return out


def test_sigkill_at_random_points_of_finetune(teacher, tmp_path, rng):
    from conftest import WORDS

    def rows(n: int, seed: int) -> str:  # label: whether the sentence has a cat in it
        r = random.Random(seed)
        out = []
        for i in range(n):
            words = [r.choice(WORDS[2:]) for _ in range(r.randint(4, 9))]
            if i % 2:
                words.insert(r.randrange(len(words) + 1), "cat")
            out.append(f"{' '.join(w for w in words if w != 'cat' or i % 2)},{'yes' if i % 2 else 'no'}")
        return "text,label\n" + "\n".join(out) + "\n"

    (tmp_path / "train.csv").write_text(rows(240, 1))
    (tmp_path / "dev.csv").write_text(rows(40, 2))
    reference = tmp_path / "reference"

    def command(out: str) -> list[str]:
        return ["finetune", "classify", "--model", str(teacher), "--train", str(tmp_path / "train.csv"), "--dev",
                str(tmp_path / "dev.csv"), "--out", str(tmp_path / out), "--resume", "--quiet", "--epochs", "3",
                "--batch-size", "8", "--learning-rate", "3e-3", "--max-seq-length", "24", "--save-every", "4",
                "--log-every", "1"]

    duration = timed_run(command("reference"))
    expected = __import__("json").loads((reference / "results.json").read_text())

    def check(out: str) -> None:
        run = tmp_path / out
        results = __import__("json").loads((run / "results.json").read_text())
        assert training_records(run) == training_records(reference)  # every step, bit for bit
        assert results["epochs"] == expected["epochs"] and results["best"] == expected["best"]
        assert (run / "model" / "model.safetensors").read_bytes() == \
            (reference / "model" / "model.safetensors").read_bytes()

    episodes = campaign(command, rng, KILLS, duration, check)
    print(f"finetune: {KILLS} kills over {episodes} episodes, each ending identical to the uninterrupted run")


def test_sigkill_at_random_points_of_distill(corpus, teacher, tmp_path, rng):
    text, tok = corpus
    data = tmp_path / "data"
    prepare([text], tok, data, progress=False, eval_fraction=0.02)
    reference = tmp_path / "reference"

    def command(out: str) -> list[str]:
        return ["distill", "mlm", "--teacher", str(teacher), "--data", str(data), "--out", str(tmp_path / out),
                "--resume", "--student-preset", "tiny", "--max-steps", "40", "--save-every", "4", "--log-every", "2",
                "--batch-size", "16", "--max-seq-length", "32", "--progress", "false", "--eval-instances", "16",
                "--hidden-size", "32", "--num-attention-heads", "2", "--intermediate-size", "64"]

    duration = timed_run(command("reference"))

    def check(out: str) -> None:
        run = tmp_path / out
        assert training_records(run) == training_records(reference)  # every step, bit for bit
        assert (run / "model" / "model.safetensors").read_bytes() == \
            (reference / "model" / "model.safetensors").read_bytes()

    episodes = campaign(command, rng, KILLS, duration, check)
    print(f"distill: {KILLS} kills over {episodes} episodes, each ending identical to the uninterrupted run")


def test_concurrent_writers_leave_one_winner(corpus, tmp_path):
    text, tok = corpus
    out = tmp_path / "data"
    argv = ["prepare", "--corpus", str(text), "--tokenizer", str(tok), "--out", str(out), "--quiet",
            "--shard-tokens", "20000"]
    procs = [subprocess.Popen(bertkit_command(*argv), env=subprocess_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outcomes = sorted((p.wait(), p.stderr.read()) for p in procs)
    assert [code for code, _ in outcomes] == [0, 2, 2], outcomes
    for _, err in outcomes[1:]:
        assert one_error_line(err).startswith(f"bertkit: error: {out} is in use by another bertkit process (pid ")
    reference = prepare([text], tok, tmp_path / "reference", progress=False, shard_tokens=20000)
    assert (out / MANIFEST).read_bytes() != b"" and reference.data["splits"] == \
        __import__("json").loads((out / MANIFEST).read_text())["splits"]

    run = tmp_path / "run"
    settings = dict(max_steps=30, save_every=5, log_every=1)
    procs = [subprocess.Popen(bertkit_command(*pretrain_argv(out, run, **settings)), env=subprocess_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outcomes = sorted((p.wait(), p.stderr.read()) for p in procs)
    assert [code for code, _ in outcomes] == [0, 2], outcomes
    assert one_error_line(outcomes[1][1]).startswith(f"bertkit: error: {run} is in use by another bertkit process")
    assert sorted(losses(run)) == list(range(1, 31))  # one writer: every step once


def _children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return sorted(found)


def test_torchrun_restarts_a_job_whose_rank_was_killed(corpus, tmp_path):
    """2 CPU processes; one rank SIGKILLed after a checkpoint; `torchrun --max-restarts 1` starts the job again with
    the same command line (which has --resume from the first launch on) and it ends with the losses of the
    uninterrupted job."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("finding the worker processes needs /proc")
    text, tok = corpus
    data = tmp_path / "data"
    prepare([text], tok, data, progress=False)
    settings = dict(max_steps=40, save_every=3, log_every=1, batch_size=4)

    def torchrun(out: Path) -> list[str]:
        import sys

        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "--max-restarts", "1", "-m", "bertkit.cli", *pretrain_argv(data, out, "--resume", **settings)]

    reference = tmp_path / "reference"
    result = subprocess.run(torchrun(reference), env=subprocess_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    proc = subprocess.Popen(torchrun(run), env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 300
    while not (run / "checkpoints" / "step-00000006.pt").exists():
        assert proc.poll() is None and time.time() < deadline, "the job ended before a rank could be killed"
        time.sleep(0.05)
    workers = _children(proc.pid)
    assert len(workers) == 2, workers
    os.kill(workers[-1], signal.SIGKILL)  # one rank dies; the agent stops the other and restarts both
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "restart" in err.lower() or "Restarting" in err, err[-3000:]
    assert training_records(run) == training_records(reference)


def test_a_killed_data_worker_ends_the_run_with_one_line_and_resume_continues_exactly(corpus, tmp_path):
    """`--workers 1`: the batches come from a worker process. Killing it ends the run with one line (no
    traceback); `--resume` then finishes it with every step's loss bit for bit those of a run whose batches were
    made in the training process (`--workers 0`): the workers change where batches are made, never what they are."""
    text, tok = corpus
    data_dir = tmp_path / "data"
    prepare([text], tok, data_dir, progress=False, eval_fraction=0.02)
    argv = lambda run, workers, *extra: pretrain_argv(data_dir, run, "--workers", str(workers), "--max-steps",  # noqa: E731
                                                      "24", "--save-every", "3", "--log-every", "1", *extra)
    plain = tmp_path / "plain"
    done = subprocess.run(bertkit_command(*argv(plain, 0)), env=subprocess_env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "run"
    proc = subprocess.Popen(bertkit_command(*argv(run, 1)), env=subprocess_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (run / "checkpoints" / "step-00000006.pt").exists():
        assert proc.poll() is None and time.time() < deadline, "the run ended before its worker could be killed"
        time.sleep(0.02)
    workers = _children(proc.pid)
    assert workers, "no data worker process"
    os.kill(workers[0], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 2
    assert "worker process" in one_error_line(stderr) and "--resume" in one_error_line(stderr)
    assert max(losses(run)) < 24, "the run finished before the kill; nothing was tested"
    resumed = subprocess.run(bertkit_command(*argv(run, 1, "--resume")), env=subprocess_env(), capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert losses(run) == losses(plain) and len(losses(plain)) == 24
