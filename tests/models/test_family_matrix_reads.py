"""No device read between log steps for every fine-tuning cell of the family x kind matrix: `bertkit finetune KIND`
on the family's tiny directory (tests/models/test_family_matrix.py makes them and the task files), counted by the
mode of tests/device_reads.py. A file of its own, so that the suite's workers run it beside the matrix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.tasks.base import REFUSED
from device_reads import count_reads
from test_family_matrix import CELLS, FINETUNE_KINDS, finetune_argv, matrix  # noqa: F401 (matrix: the fixture)


def tripled(data: dict[str, Path], root: Path) -> dict[str, Path]:
    """The task files with every example three times (squad: every paragraph, question ids made unique)."""
    root.mkdir(exist_ok=True)
    out = {}
    for kind, path in data.items():
        text = path.read_text(encoding="utf-8")
        if kind == "squad":
            squad = json.loads(text)
            paragraphs = squad["data"][0]["paragraphs"]
            squad["data"][0]["paragraphs"] = [
                {**p, "qas": [{**q, "id": f"{q['id']}-{copy}"} for q in p["qas"]]}
                for copy in range(3) for p in paragraphs]
            text = json.dumps(squad)
        elif kind == "ner":
            text = "\n\n".join([text.strip()] * 3) + "\n"
        else:  # a header line, then one example per line
            header, *rows = text.strip().splitlines()
            text = "\n".join([header, *rows * 3]) + "\n"
        out[kind] = root / path.name
        out[kind].write_text(text, encoding="utf-8")
    return out


FINETUNE_CELLS = [(f, k) for f, k in CELLS if k in FINETUNE_KINDS and (f, k) not in REFUSED]


@pytest.mark.parametrize("family, kind", [pytest.param(f, k, id=f"{f}-{k}") for f, k in FINETUNE_CELLS])
def test_no_device_reads_between_logs_fine_tuning(family, kind, matrix, tmp_path, monkeypatch):
    # `bertkit finetune KIND` on the family's directory: one epoch over the task file and over the file three times
    # (three times the steps), the same dev file, one log line, one evaluation and one save at the end. A read of a
    # device value every step (a loss, a mask's positions, a layout's sizes) would make the longer run read more.
    from bertkit.models import layouts

    monkeypatch.setattr(layouts, "checks_values", lambda x: False)  # the batch plays the device's
    longer = tripled(matrix.data, matrix.root / "tripled") if not (matrix.root / "tripled").is_dir() else \
        {kind: matrix.root / "tripled" / path.name for kind, path in matrix.data.items()}

    def run(train: Path, name: str):
        argv = finetune_argv(family, kind, matrix.model(family), {**matrix.data, kind: train}, tmp_path / name)
        argv = [*argv, "--log-every", "1000"]
        return lambda: run_argv(argv)

    def run_argv(argv):
        assert main([str(a) for a in argv]) == 0

    short, long = [], []
    assert count_reads(run(matrix.data[kind], "short"), monkeypatch, short) == \
        count_reads(run(longer[kind], "long"), monkeypatch, long), (short, long)
