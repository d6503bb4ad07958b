"""The GPU check suite (bench/gpu/) runs end to end on CPU: its dry run writes the files a GPU run writes, every
correctness check passes or says why it skipped, a failing check is recorded without stopping the rest, and the
README's GPU table has the report's columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench.gpu is imported from the repository root

pytest.importorskip("transformers")


def table_checks() -> set[str]:
    """A sync-debug step run per row of the objective table (and per other model file among the architectures
    that take it) and per fine-tuning family: the GPU suite's rows, read from the tables themselves."""
    from bertkit.models.registry import ARCHITECTURES, OBJECTIVES

    names = {f"no_sync_finetune_{family}" for family in ARCHITECTURES}
    for name, row in OBJECTIVES.items():
        first = ARCHITECTURES[row.architectures[0]].config_class
        names.add(f"no_sync_{name}")
        names |= {f"no_sync_{arch}_{name}" for arch in dict.fromkeys(
            a for a in row.architectures if ARCHITECTURES[a].config_class is not first)
            if arch == next(a for a in row.architectures
                            if ARCHITECTURES[a].config_class is ARCHITECTURES[arch].config_class)}
    return names


CHECK_NAMES = table_checks() | {"unpad_fp32", "unpad_bf16", "unpad_modernbert_bf16", "fused_qkv", "sparse_mlm", "onednn_switch", "fused_adamw",
               "bf16_loss_curve", "model_directory", "exact_resume", "family_bert", "family_roberta",
               "family_albert", "family_electra", "family_causal", "family_distilbert", "family_t5", "family_xlnet",
               "family_modernbert", "ddp_step", "no_sync_steps", "no_sync_task_steps"}
SPEED_ROWS = {"peak", "pretrain_T32_dense", "pretrain_T32_varlen", "pretrain_T64_dense", "pretrain_T64_varlen",
              "pretrain_T32_varlen_attn0",
              "inference_T32_dense", "inference_T32_varlen", "inference_T64_dense", "inference_T64_varlen",
              "modernbert_T32_varlen", "modernbert_T64_varlen", "pretrain_T32_dense_compiled",
              "pretrain_T32_varlen_compiled", "inference_T32_dense_compiled", "inference_T32_varlen_compiled",
              "e2e_pretrain_bert", "e2e_pretrain_roberta", "e2e_pretrain_modernbert_T1024", "e2e_pretrain_t5",
              "e2e_finetune_sst2"}
# Keys every timed bertkit-vs-transformers record carries, on CPU as on a GPU (memory is null off CUDA).
TIMED_KEYS = {"bench", "model", "seq_len", "batch", "batch_size", "dtype", "compile", "bertkit_tokens_per_s",
              "transformers_tokens_per_s", "ratio", "ratio_best", "bertkit_mfu", "transformers_mfu", "peak_gflops",
              "bertkit_peak_step_mib", "transformers_peak_step_mib", "resident_mib", "real_tokens", "padded_tokens",
              "iters", "warmup", "goal_ratio", "goal_ratio_met"}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-results")
    env = {**os.environ, "OUT": str(out), "OMP_NUM_THREADS": "1", "BERTKIT_SUITE_DDP_CPU": "2"}
    start = time.perf_counter()
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu" / "run.sh"), "--device", "cpu", "--quick"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return out, proc, time.perf_counter() - start


def test_cpu_dry_run_writes_every_result_file(dry_run):
    out, proc, seconds = dry_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    correctness = json.loads((out / "correctness.json").read_text())
    speed = json.loads((out / "speed.json").read_text())
    environment = json.loads((out / "environment.json").read_text())
    assert correctness["finished"] and speed["finished"]
    assert environment == correctness["environment"] == speed["environment"]
    for key in ("device_name", "driver", "cuda", "torch", "transformers", "flash_attn", "gpu_count", "python"):
        assert key in environment, key
    assert environment["torch"] == torch.__version__ and environment["device"] == "cpu"

    checks = {c["name"]: c for c in correctness["checks"]}
    assert set(checks) == CHECK_NAMES
    for name, check in checks.items():
        assert check["status"] in ("passed", "skipped"), (name, check.get("error"), check.get("traceback"))
        if check["status"] == "skipped":
            assert check["reason"].strip(), name
    assert correctness["summary"]["failed"] == 0
    # What each check measured is in its record: tolerances, differences, the kernel that ran.
    assert checks["unpad_fp32"]["max_abs_diff"] <= checks["unpad_fp32"]["tolerance"] == 1e-5
    assert checks["unpad_bf16"]["attention_kernel"]["bidirectional/unpadded"] == "sdpa"
    assert checks["exact_resume"]["fp32_bitwise"] and checks["exact_resume"]["bf16_bitwise"]
    assert checks["ddp_step"]["status"] == "passed" and checks["ddp_step"]["backend"] == "gloo"

    records = {r["name"]: r for r in speed["records"]}
    assert set(records) == SPEED_ROWS
    for name, record in records.items():
        assert record["status"] in ("ok", "skipped"), (name, record.get("error"), record.get("traceback"))
        if record["status"] == "skipped":
            assert record["reason"].strip(), name
    timed = [r for r in records.values() if r["status"] == "ok" and r["bench"] in ("pretrain_step", "inference")]
    assert len(timed) == 11
    for record in timed:
        assert TIMED_KEYS <= set(record), (record["name"], TIMED_KEYS - set(record))
        assert record["bertkit_tokens_per_s"] > 0 and record["transformers_tokens_per_s"] > 0
        assert 0 < record["bertkit_mfu"] and record["bertkit_peak_step_mib"] is None  # no CUDA: no memory figure
        assert record["real_tokens"] <= record["padded_tokens"]
    assert records["pretrain_T32_dense"]["real_tokens"] == records["pretrain_T32_dense"]["padded_tokens"]
    assert records["pretrain_T32_varlen"]["real_tokens"] < records["pretrain_T32_varlen"]["padded_tokens"]
    assert "goal_mfu" in records["pretrain_T32_dense"] and "goal_mfu" not in records["inference_T32_dense"]
    assert records["pretrain_T32_varlen_compiled"]["compile"] is True
    assert records["modernbert_T32_varlen"]["modernbert_attention"] == "sdpa"
    # The end-to-end row: `bertkit pretrain` through the CLI, against bertkit's own model step of the same run.
    e2e = records["e2e_pretrain_bert"]
    assert e2e["status"] == "ok" and e2e["bertkit_tokens_per_s"] > 0 and e2e["model_step_tokens_per_s"] > 0
    assert e2e["ratio_to_step"] == pytest.approx(e2e["bertkit_tokens_per_s"] / e2e["model_step_tokens_per_s"])
    # The peer (bench/gpu/peer_trainer.py, transformers' Trainer on run_mlm.py's recipe) ran on the same shards.
    assert e2e["peer"] == "transformers Trainer (run_mlm.py recipe, BertForMaskedLM)" and e2e["peer_tokens_per_s"] > 0
    assert e2e["ratio"] == pytest.approx(e2e["bertkit_tokens_per_s"] / e2e["peer_tokens_per_s"])

    report = (out / "report.md").read_text()
    from bench.gpu.report import SPEED_HEADER

    assert SPEED_HEADER in report
    assert "attention dropout 0" in records["pretrain_T32_varlen_attn0"]["model"]
    assert records["modernbert_T32_varlen"]["float32_max_diff"] <= 1e-3
    assert report.count("| pretraining step, ") == 6 and report.count("| inference, ") == 7
    # One progress line per item, on stdout.
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("[correctness]", "[speed]"))]
    assert len(lines) == len(CHECK_NAMES) + len(SPEED_ROWS)
    assert seconds < 120, f"the dry run took {seconds:.0f} s"


def test_bench_readme_gpu_table_has_the_report_columns():
    from bench.gpu.report import SPEED_HEADER

    readme = (ROOT / "bench" / "README.md").read_text()
    assert "bash bench/gpu/run.sh --device cpu --quick" in readme
    assert SPEED_HEADER in readme


def test_a_failing_check_is_recorded_and_the_suite_goes_on(tmp_path, monkeypatch, capsys):
    from bench.gpu import checks, suite

    def boom(ctx, measured):
        measured["max_abs_diff"] = 0.5
        raise AssertionError("out of tolerance")

    def absent(ctx, measured):
        raise suite.Skip("needs a device this machine lacks")

    monkeypatch.setattr(checks, "CHECKS", [("boom", boom), ("absent", absent), ("fused_qkv", checks.check_fused_qkv)])
    status = suite.main(["--device", "cpu", "--quick", "--skip-speed", "--out", str(tmp_path)])
    assert status == 1
    records = {c["name"]: c for c in json.loads((tmp_path / "correctness.json").read_text())["checks"]}
    assert records["boom"]["status"] == "failed" and records["boom"]["error"] == "AssertionError: out of tolerance"
    assert records["boom"]["max_abs_diff"] == 0.5  # what was measured before the failure is kept
    assert records["absent"]["status"] == "skipped"
    assert records["absent"]["reason"] == "needs a device this machine lacks"
    assert records["fused_qkv"]["status"] == "passed"  # the check after the failure ran
    printed = capsys.readouterr().out
    assert "[correctness] boom" in printed and "failed" in printed
    assert suite.exit_status([records["absent"], records["fused_qkv"]]) == 0


def test_setup_distributed_gives_a_bare_cuda_device_its_index(monkeypatch):
    """torch.cuda.set_device refuses torch.device("cuda") without an index: the trainer must resolve it."""
    from bertkit.training import trainer

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: chosen.append(device))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    info, device = trainer.setup_distributed("cuda")
    assert device == torch.device("cuda", 0) and chosen == [torch.device("cuda", 0)] and info.world_size == 1
