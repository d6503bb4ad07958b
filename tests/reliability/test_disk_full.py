"""A full disk: one error naming the file and the bytes it needed, no temporary file left behind, what killed runs
left cleaned at the next start, a torn metrics line tolerated, and --resume exact once space is back.

The fast tests make writes fail with ENOSPC by replacing `open` in the writing module (the bytes before the failure
do reach the disk, as they would on a real device); the slow test fills a real tmpfs at ten levels (root only)."""

from __future__ import annotations

import builtins
import errno
import io
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from reliability_helpers import (make_prepared, one_error_line, pretrain_argv, run_bertkit, tiny_overrides,
                                 training_records)
from safetensors import SafetensorError

import bertkit.checkpoint
import bertkit.io
from bertkit.checkpoint import save_checkpoint
from bertkit.cli import main
from bertkit.data.prepare import prepare
from bertkit.io import DiskFullError, atomic_write
from bertkit.pipeline.plots import read_metrics
from bertkit.training.pretrain import pretrain, resolve_config


class _FullFile(io.RawIOBase):
    """A writable file on a device with `room` bytes left: writes go through up to it, then fail with ENOSPC."""

    def __init__(self, handle, room: int) -> None:
        self.handle, self.room = handle, room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        if len(data) > self.room:
            self.handle.write(data[:self.room])
            self.handle.flush()
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()

    def fileno(self) -> int:
        return self.handle.fileno()

    def tell(self) -> int:
        return self.handle.tell()

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.handle.seek(offset, whence)

    def close(self) -> None:
        if not self.closed:
            super().close()
            self.handle.close()


def full_device(monkeypatch, module, match: str, room: int = 100, after: int = 0) -> list[str]:
    """Make `open(..., "w"/"a")` in `module` give a device with `room` bytes left for files whose name contains
    `match`, from the (after + 1)-th such open on. Returns the list of paths that failed (filled as they fail)."""
    failed: list[str] = []
    seen = [0]

    def fake_open(file, mode="r", *args, **kwargs):
        handle = builtins.open(file, mode, *args, **kwargs)
        if match in os.fspath(file) and ("w" in mode or "a" in mode):
            seen[0] += 1
            if seen[0] > after:
                failed.append(os.fspath(file))
                return _FullFile(handle, room)
        return handle

    monkeypatch.setattr(module, "open", fake_open, raising=False)
    return failed


def leftovers(directory: Path) -> list[str]:
    """Temporary files and staging folders anywhere under `directory`."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob(".*")
                  if ".tmp" in p.name or p.name.endswith(".old") or p.name.count(".") >= 3 and p.is_dir())


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_prepared(tmp_path_factory.mktemp("diskfull"))


# ---- the writers ---------------------------------------------------------------------------------------------
def test_atomic_write_names_the_file_and_the_bytes_and_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "manifest.json"
    target.write_text("old contents")
    full_device(monkeypatch, bertkit.io, "manifest.json", room=10)
    with pytest.raises(DiskFullError) as err:
        atomic_write(target, "x" * 5000)
    message = str(err.value)
    assert message.startswith(f"{target}: no space left on the device: it needs 5,000 bytes, ")
    assert "free on that file system; free some space and run again" in message
    assert target.read_text() == "old contents" and os.listdir(tmp_path) == ["manifest.json"]


def test_a_resume_checkpoint(tmp_path, monkeypatch):
    state = {"model": {"w": torch.ones(1000)}, "step": 3}
    save_checkpoint(tmp_path / "step-00000003.pt", state, keep_last=2)
    full_device(monkeypatch, bertkit.checkpoint, "step-00000006", room=1000)
    path = tmp_path / "step-00000006.pt"
    with pytest.raises(DiskFullError) as err:  # torch.save says "unexpected pos"; the cause is found
        save_checkpoint(path, {**state, "step": 6}, keep_last=2)
    assert str(err.value).startswith(f"{path}: no space left on the device: it needs 4,000 bytes")
    assert os.listdir(tmp_path) == ["step-00000003.pt"]  # no temporary file; the previous checkpoint kept


def test_a_model_directory(tmp_path, monkeypatch, tiny_tokenizer):
    from conftest import tiny_config

    from bertkit import BertForPreTraining

    model = BertForPreTraining(tiny_config())
    model.save_pretrained(tmp_path / "model", tokenizer=tiny_tokenizer)
    before = (tmp_path / "model" / "model.safetensors").read_bytes()

    def no_room(state, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 100)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(bertkit.checkpoint, "save_file", no_room)
    with pytest.raises(DiskFullError) as err:
        model.save_pretrained(tmp_path / "model", tokenizer=tiny_tokenizer)
    # The weights as stored: every parameter once (the decoder tied to the word embeddings is not written).
    need = sum(p.numel() * 4 for p in model.parameters())
    assert str(err.value).startswith(f"{tmp_path / 'model'}: no space left on the device: it needs ")
    assert f"({need:,} bytes)" in str(err.value) or f"needs {need:,} bytes" in str(err.value)
    assert sorted(os.listdir(tmp_path)) == ["model"]  # the staging folder is gone
    assert (tmp_path / "model" / "model.safetensors").read_bytes() == before


def test_prepare_names_the_shard_removes_its_temporary_and_finishes_once_space_is_back(data_dir, tmp_path,
                                                                                        monkeypatch):
    corpus, tok = data_dir.parent / "corpus.txt", data_dir.parent / "tok"
    failed = full_device(monkeypatch, bertkit.io, "tokens.bin", room=64)
    with pytest.raises(DiskFullError) as err:
        prepare([corpus], tok, tmp_path / "data", progress=False, shard_tokens=300)
    shard = tmp_path / "data" / "train" / "shard_00000.tokens.bin"
    assert failed and str(err.value).startswith(f"{shard}: no space left on the device: it needs ")
    assert leftovers(tmp_path) == [] and not (tmp_path / "data" / "manifest.json").exists()
    monkeypatch.undo()
    manifest = prepare([corpus], tok, tmp_path / "data", progress=False, shard_tokens=300)
    reference = prepare([corpus], tok, tmp_path / "reference", progress=False, shard_tokens=300)
    assert manifest.data["splits"] == reference.data["splits"]  # same shards, same checksums


def test_the_cli_says_it_in_one_line(data_dir, tmp_path, monkeypatch, capsys):
    failed = full_device(monkeypatch, bertkit.io, "tokens.bin", room=64)
    code = main(["prepare", "--corpus", str(data_dir.parent / "corpus.txt"), "--tokenizer",
                 str(data_dir.parent / "tok"), "--out", str(tmp_path / "data"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and failed
    line = one_error_line(err)
    assert line.startswith(f"bertkit: error: {tmp_path}/data/train/shard_00000.tokens.bin: no space left on the "
                           f"device: it needs ")


# ---- a pretraining run: full disk at three writers, torn metrics, stale temporaries, exact resume ----------------
def test_pretrain_stops_cleanly_and_resumes_exactly(data_dir, tmp_path, monkeypatch, capsys):
    settings = dict(max_steps=12, save_every=3, log_every=2)
    reference = tmp_path / "reference"
    pretrain(data_dir, reference, resolve_config("tiny", tiny_overrides(**settings)), eval_at_start=False)
    run = tmp_path / "run"
    argv = pretrain_argv(data_dir, run, **settings)

    # 1. metrics.jsonl fills the disk at its 3rd line (step 6): the line is cut back, not left torn.
    full_device(monkeypatch, bertkit.io, "metrics.jsonl", room=20, after=2)
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"bertkit: error: {run}/metrics.jsonl: no space left on the device: it needs ")
    assert (run / "metrics.jsonl").read_text().endswith("}\n")  # no torn line
    monkeypatch.undo()
    # 2. the resumed run's second checkpoint (step 9) does not fit.
    full_device(monkeypatch, bertkit.checkpoint, "step-00000009", room=5000)
    assert main([*argv, "--resume"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"bertkit: error: {run}/checkpoints/step-00000009.pt: no space left on the device: "
                           f"it needs ")
    assert leftovers(run) == []
    monkeypatch.undo()
    # 3. what a SIGKILL or an older writer can leave: a torn metrics line, a temporary checkpoint, a staging
    # folder, and the model directory moved aside between the two renames of its replacement.
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 8, "loss": 3.1')
    (run / "checkpoints" / ".step-00000009.pt.tmp99999999").write_bytes(b"\0" * 1000)
    (run / ".model.99999999.0123abcd").mkdir()
    os.replace(run / "model", run / ".model.old")
    assert main([*argv, "--resume"]) == 0
    err = capsys.readouterr().err
    assert "removed a torn last line" in err and "left by an interrupted run" in err
    assert leftovers(run) == [] and (run / "model" / "model.safetensors").is_file()
    assert training_records(run) == training_records(reference)  # every logged step, bit for bit


# ---- readers -------------------------------------------------------------------------------------------------
def test_read_metrics_tolerates_one_torn_last_line(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo', encoding="utf-8")
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    assert f"{path}:3: left out a torn last line" in capsys.readouterr().err
    assert path.read_text().endswith('"lo')  # a reader does not change the file
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo\n{"step": 3, "loss": 1.0}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=f"^{path}:2: not valid JSON"):  # damage inside the file is not a tear
        read_metrics(path)


# ---- a real full device: a tmpfs filled at ten levels (root only) --------------------------------------------------
@pytest.mark.slow
def test_a_real_full_tmpfs_at_ten_levels(data_dir, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "mnt"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("this machine does not allow mounting a tmpfs")
    try:
        settings = dict(max_steps=8, save_every=2, log_every=1)
        reference = tmp_path / "reference"
        pretrain(data_dir, reference, resolve_config("tiny", tiny_overrides(**settings)), eval_at_start=False)
        run = mount / "run"
        failed_at = {}  # device size -> the file whose write did not fit
        # From a device too small for the first checkpoint to one that holds the whole run.
        for kib in (48, 128, 256, 384, 512, 640, 768, 1024, 1280, 2048):
            shutil.rmtree(run, ignore_errors=True)
            subprocess.run(["mount", "-o", f"remount,size={kib}k", str(mount)], check=True)
            result = run_bertkit(*pretrain_argv(data_dir, run, **settings))
            if result.returncode != 0:
                assert result.returncode == 2, result.stderr[-2000:]
                line = one_error_line(result.stderr)
                assert f"{run}/" in line and ": no space left on the device: it needs " in line, line
                assert leftovers(run) == [], (kib, leftovers(run))
                failed_at[kib] = line.split(": no space")[0].split(f"{run}/")[1]
            subprocess.run(["mount", "-o", "remount,size=16m", str(mount)], check=True)
            resumed = run_bertkit(*pretrain_argv(data_dir, run, "--resume", **settings))
            assert resumed.returncode == 0, (kib, resumed.stderr[-2000:])
            assert training_records(run) == training_records(reference), kib
        print(failed_at)
        # The levels stop the run at several different writers, and the largest device holds the whole run.
        assert len(set(failed_at.values())) >= 2 and 2048 not in failed_at, failed_at
    finally:
        subprocess.run(["umount", str(mount)])
