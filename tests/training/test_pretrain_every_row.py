"""Every row of the objective table (tests/training/objective_rows.py enumerates it), through the command line: 2 and 4 gloo
processes log the per-step losses of 1 process with the same global batch (within 1e-5), and a run SIGKILLed at an
arbitrary moment after a checkpoint and resumed with --resume logs those losses bit for bit.

One process start per process count runs the whole table (tests/training/objective_rows.py's `run_all`, under torchrun for
2 and 4 processes: one process group after another); every row's assertions read those runs. The SIGKILL runs are
one process each (a run killed, then its resume).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import kill_after_checkpoint
from objective_rows import cases, prepared, pretrain_args, run_args

pytestmark = pytest.mark.slow  # the whole table on 1, 2 and 4 processes, and a killed and resumed run per row

STEPS = 12
DRIVER = str(Path(__file__).with_name("objective_rows.py"))


def env() -> dict[str, str]:
    tests, src = Path(__file__).resolve().parent, Path(__file__).resolve().parents[2] / "src"
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0",
            "PYTHONPATH": os.pathsep.join([str(src), str(tests), os.environ.get("PYTHONPATH", "")])}


def losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("every-row")
    for case in cases():
        prepared(case, root)  # once, before any process reads the shards
    return root


@pytest.fixture(scope="module")
def table_runs(root):
    """processes -> whether the whole table ran on that many processes (the runs under root/<case>-p<processes>);
    each process count runs on first use."""
    done: dict[int, str] = {}

    def run(processes: int) -> Path:
        if processes not in done:
            launch = [sys.executable, DRIVER] if processes == 1 else \
                [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
                 DRIVER]
            proc = subprocess.run([*launch, str(root), str(processes)], env=env(), capture_output=True, text=True,
                                  timeout=900)
            done[processes] = "" if proc.returncode == 0 else proc.stderr[-3000:]
        assert not done[processes], done[processes]
        return root

    return run


@pytest.mark.parametrize("processes", [2, 4])
@pytest.mark.parametrize("case", cases(), ids=lambda case: case.id)
def test_gloo_processes_equal_one_process(case, processes, table_runs):
    one = losses(table_runs(1) / f"{case.id}-p1")
    many = losses(table_runs(processes) / f"{case.id}-p{processes}")
    assert sorted(one) == sorted(many) == list(range(1, STEPS + 1))
    for step in one:
        assert abs(one[step] - many[step]) < 1e-5, (step, one[step], many[step])


@pytest.mark.parametrize("case", cases(), ids=lambda case: case.id)
def test_sigkilled_run_resumes_bit_identically(case, root, table_runs, tmp_path):
    # The uninterrupted run is the table's one-process run (same command line, other directory)
    full = losses(table_runs(1) / f"{case.id}-p1")
    killed = tmp_path / "killed"
    args = [sys.executable, "-m", "bertkit.cli", *pretrain_args(case, prepared(case, root), killed, *run_args(1))]
    kill_after_checkpoint(args, killed, env(), step=3, timeout=180)
    assert max(losses(killed), default=0) < STEPS, "the run finished before the kill; nothing was tested"
    proc = subprocess.run([*args, "--resume"], env=env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert losses(killed) == full  # every step, bit for bit
