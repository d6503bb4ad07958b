"""One writer per run or data directory: a second writer is refused at once with one line naming the directory
and the holder's pid; a SIGKILLed holder leaves no stale lock; the ranks of one job are one writer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reliability_helpers import (bertkit_command, losses, make_prepared, one_error_line, pretrain_argv, run_bertkit,
                                 subprocess_env)

from bertkit.io import LOCK_NAME, DirectoryLockedError, lock_directory, lock_holder

HOLD = "import sys, time; from bertkit.io import lock_directory\nwith lock_directory(*sys.argv[1:]):\n" \
       "    print('held', flush=True); time.sleep(120)\n"
TRY = "import sys; from bertkit.io import lock_directory\nwith lock_directory(sys.argv[1]): print('acquired')\n"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_prepared(tmp_path_factory.mktemp("locking"))


def _holder(directory: Path, *name: str) -> subprocess.Popen:
    """A process that holds `directory`'s lock (or the lock file `name` in it) until killed (returns once it
    holds it)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory), *name], stdout=subprocess.PIPE, text=True,
                            env=subprocess_env())
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_naming_the_directory_and_the_pid(tmp_path):
    with lock_directory(tmp_path / "run") as held:
        assert held == tmp_path / "run" and (held / LOCK_NAME).read_text().split()[0] == str(os.getpid())
        with lock_directory(tmp_path / "run"):  # re-entrant within the process
            pass
        assert lock_holder(held) == os.getpid()
        other = subprocess.run([sys.executable, "-c", TRY, str(held)], capture_output=True, text=True,
                               env=subprocess_env())
        assert other.returncode != 0 and "acquired" not in other.stdout
        last = other.stderr.strip().splitlines()[-1]
        assert last == (f"bertkit.io.DirectoryLockedError: {held} is in use by another bertkit process "
                        f"(pid {os.getpid()}); one writer per directory: wait for it to end, stop it, or choose "
                        f"another output")
    assert not (held / LOCK_NAME).exists() and lock_holder(held) is None  # released and removed on exit
    assert not held.exists()  # the lock created the directory and nothing was written: nothing is left


def test_a_sigkilled_holder_leaves_no_stale_lock(tmp_path):
    directory = tmp_path / "run"
    proc = _holder(directory)
    with pytest.raises(DirectoryLockedError) as err:
        with lock_directory(directory):
            pass
    assert err.value.pid == proc.pid and f"pid {proc.pid}" in str(err.value)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (directory / LOCK_NAME).exists()  # the file stays; the lock on it went with the process
    assert lock_holder(directory) is None
    with lock_directory(directory):
        assert lock_holder(directory) == os.getpid()


def test_two_pretrain_runs_on_one_directory(data_dir, tmp_path, capsys):
    """The second `bertkit pretrain --out SAME` exits 2 with one line naming the directory and the first run's
    pid, and leaves the first run's files alone; the first run, SIGKILLed, leaves no lock."""
    from bertkit.checkpoint import latest_checkpoint
    from bertkit.cli import main

    run = tmp_path / "run"
    log = (tmp_path / "first.stderr").open("w")
    first = subprocess.Popen(bertkit_command(*pretrain_argv(data_dir, run, max_steps=100000, save_every=2,
                                                            log_every=1)),
                             env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=log)
    try:
        # Training (and holding the lock) once any checkpoint exists. Not one named file: with keep_last 2 the run
        # deletes step 2's file when it writes step 6's, a window of 4 tiny steps (tens of ms on an idle machine)
        # that a 50 ms poll, or a descheduled test process, misses; the wait then ran into its deadline, reported
        # as "the first run ended before the test".
        deadline = time.time() + 300  # a bound for a run that hangs, not a timing: the first step comes in seconds
        while latest_checkpoint(run) is None:
            why = lambda: (tmp_path / "first.stderr").read_text()[-2000:]  # noqa: E731 - read only on failure
            assert first.poll() is None, f"the first run ended before the test: {why()}"
            assert time.time() < deadline, f"the first run wrote no checkpoint in 300 s: {why()}"
            time.sleep(0.05)
        # The second run in this process (the refusal comes before any work): one interpreter start fewer.
        code = main(pretrain_argv(data_dir, run, max_steps=5, save_every=1, log_every=1))
        assert code == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"bertkit: error: {run} is in use by another bertkit process (pid {first.pid})")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    steps = sorted(losses(run))
    assert len(steps) >= 2 and steps == list(range(1, len(steps) + 1))  # one writer: every step once, in order
    # The SIGKILLed run's lock went with it (tests/training/test_pretrain.py resumes such a run through the command line).
    assert (run / LOCK_NAME).exists() and lock_holder(run) is None


def test_prepare_refuses_a_locked_data_directory(tmp_path, data_dir):
    out = tmp_path / "data"
    proc = _holder(out)
    try:
        result = run_bertkit("prepare", "--corpus", str(data_dir.parent / "corpus.txt"), "--tokenizer",
                             str(data_dir.parent / "tok"), "--out", str(out), "--quiet")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert result.returncode == 2
    assert one_error_line(result.stderr) == (f"bertkit: error: {out} is in use by another bertkit process (pid "
                                             f"{proc.pid}); one writer per directory: wait for it to end, stop it, "
                                             f"or choose another output")
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing of the refused run was written


@pytest.fixture(scope="module")
def model_dir(data_dir) -> Path:
    """A tiny BertForPreTraining directory with the prepared data's vocabulary."""
    import torch

    from bertkit import BertConfig, BertForPreTraining
    from bertkit.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(data_dir / "tokenizer")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    BertForPreTraining(config).save_pretrained(data_dir.parent / "model", tokenizer=tokenizer)
    return data_dir.parent / "model"


def _refused(capsys, argv: list[str], subject: Path, holder: subprocess.Popen) -> None:
    from bertkit.cli import main

    try:
        code = main(argv)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert code == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"bertkit: error: {subject} is in use by another bertkit process (pid {holder.pid}); one writer per "
        f"directory: wait for it to end, stop it, or choose another output")


def test_finetune_distill_and_features_refuse_a_second_writer(data_dir, model_dir, tmp_path, capsys):
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "".join(f"the cat {w} runs,{w}\n" for w in ["big", "small"] * 8))
    out = tmp_path / "finetune"
    _refused(capsys, ["finetune", "classify", "--model", str(model_dir), "--train", str(train), "--dev", str(train),
                      "--out", str(out), "--quiet"], out, _holder(out))
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing of the refused run was written

    out = tmp_path / "distill"
    _refused(capsys, ["distill", "mlm", "--teacher", str(model_dir), "--data", str(data_dir), "--out", str(out),
                      "--student-preset", "tiny", "--max-steps", "2"], out, _holder(out))
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]

    lines = tmp_path / "lines.txt"
    lines.write_text("the cat runs\nthe dog sleeps\n")
    out = tmp_path / "features" / "feats.npy"
    _refused(capsys, ["features", "--model", str(model_dir), "--input", str(lines), "--out", str(out)], out,
             _holder(out.parent, ".feats.npy.lock"))
    assert sorted(p.name for p in out.parent.iterdir()) == [".feats.npy.lock"]
