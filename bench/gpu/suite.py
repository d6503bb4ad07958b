"""The GPU check suite: one call answers whether bertkit is correct and fast on a device, into files.

    python -m bench.gpu.suite [--device auto|cuda|cpu] [--quick] [--out DIR] [--only NAME ...] [--budget-s S]

(`bash bench/gpu/run.sh ...` is the same with the environment set up.) Three parts, each item printing one
line of progress, none able to abort the rest:

1. correctness (`bench/gpu/checks.py`): every fast path against the plain path on the same weights, on the
   device; the bf16 loss curve; checkpoint round trip and exact resume; each family against transformers;
   one DDP step over NCCL when 2+ GPUs are visible.
2. speed (`bench/gpu/speed.py`): bertkit against transformers on identical weights, interleaved, bf16 autocast,
   with MFU against a bf16 matmul peak measured in the same run, real tokens/s and peak memory.
3. the files, under --out (default $OUT, else ./gpu-results): `correctness.json`, `speed.json`,
   `environment.json` and `report.md` (Markdown tables for bench/README.md's GPU section). They are rewritten
   after every item, so a run stopped from outside still leaves what it measured.

A failing item is recorded with its error and the suite goes on; the exit status is 1 when any correctness check
failed, else 0. `--device cpu --quick` is the dry run: the same code on tiny shapes (hidden 32, 2 layers), in
well under a minute, writing files with the same names and keys.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from bench.common import _cpu_model
from bench.gpu.context import ROOT, Context, Skip

SCHEMA = 1  # bumped when a key of the result files changes meaning


# ------------------------------------------------------------------------------------------------------------------
# Running one item
# ------------------------------------------------------------------------------------------------------------------
def run_item(section: str, name: str, fn: Callable[[Context, dict], object], ctx: Context) -> dict:
    """Run `fn(ctx, measured)` and return its record; never raises (a failure is recorded with its error).

    `measured` is a dict the item fills as it goes, so figures taken before a failure are kept. Record: name,
    status (passed / failed / skipped for checks, ok / failed / skipped for measurements), seconds, the measured
    figures, and `reason` (skipped) or `error` + `traceback` (failed). One line of progress is printed.
    """
    measured: dict = {}
    start = time.perf_counter()
    record: dict = {"name": name}
    printed = io.StringIO()  # what the code under test prints ("resuming from ...") stays out of the progress
    try:
        with contextlib.redirect_stdout(printed):
            fn(ctx, measured)
        record["status"] = "passed" if section == "correctness" else "ok"
    except Skip as reason:
        record["status"], record["reason"] = "skipped", str(reason) or "no reason given"
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the point: record any failure and go on
        record["status"] = "failed"
        record["error"] = f"{type(err).__name__}: {err}"
        record["traceback"] = traceback.format_exc(limit=-6)[-4000:]
        record["output"] = printed.getvalue()[-2000:]
    finally:
        ctx.free_memory()
    record["seconds"] = round(time.perf_counter() - start, 2)
    record.update(measured)
    print(progress_line(section, record), flush=True)
    return record


def progress_line(section: str, record: dict) -> str:
    status = record["status"]
    detail = record.get("reason") or record.get("error") or record.get("summary", "")
    return f"[{section}] {record['name']:<28} {status:<7} {record['seconds']:7.2f} s  {detail}"[:400]


def exit_status(checks: list[dict]) -> int:
    """1 when any correctness check failed, else 0 (skips and speed failures do not fail the run)."""
    return 1 if any(c["status"] == "failed" for c in checks) else 0


# ------------------------------------------------------------------------------------------------------------------
# Environment
# ------------------------------------------------------------------------------------------------------------------
def environment(ctx: Context) -> dict:
    """The facts a figure needs beside it: device, driver, CUDA, library versions, commit."""
    def version(module: str) -> str | None:
        try:
            return __import__(module).__version__
        except Exception:  # noqa: BLE001 - absent or broken: reported as not importable
            return None

    env = {
        "device": str(ctx.device), "device_name": _cpu_model(), "gpu_count": 0, "gpu_memory_gib": None,
        "compute_capability": None, "driver": None, "cuda": torch.version.cuda, "cudnn": None,
        "bf16_supported": None, "torch": torch.__version__, "transformers": version("transformers"),
        "flash_attn": version("flash_attn"), "python": platform.python_version(), "cpu": _cpu_model(),
        "cpu_threads": torch.get_num_threads(), "bertkit_commit": _git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": ctx.quick, "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    if ctx.cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        env.update(device_name=props.name, gpu_count=torch.cuda.device_count(),
                   gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   compute_capability=f"{props.major}.{props.minor}", driver=_nvidia_driver(),
                   cudnn=torch.backends.cudnn.version(), bf16_supported=torch.cuda.is_bf16_supported())
    return env


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:  # no nvidia-smi: the kernel module says it too
        text = Path("/proc/driver/nvidia/version").read_text(encoding="utf-8")
        return text.split("Kernel Module", 1)[1].split()[0] if "Kernel Module" in text else text.splitlines()[0]
    except (OSError, IndexError):
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


# ------------------------------------------------------------------------------------------------------------------
# Result files
# ------------------------------------------------------------------------------------------------------------------
def write_results(ctx: Context, env: dict, checks: list[dict], speed: list[dict], finished: bool) -> None:
    """Write the four files (atomically each: a reader never sees half a file)."""
    from bench.gpu.report import markdown

    ctx.out.mkdir(parents=True, exist_ok=True)
    counts = {s: sum(c["status"] == s for c in checks) for s in ("passed", "failed", "skipped")}
    common = {"schema": SCHEMA, "finished": finished, "elapsed_s": round(ctx.elapsed(), 1)}
    _write(ctx.out / "environment.json", json.dumps(env, indent=2))
    _write(ctx.out / "correctness.json", json.dumps({**common, "environment": env, "summary": counts,
                                                     "checks": checks}, indent=2))
    _write(ctx.out / "speed.json", json.dumps({**common, "environment": env, "records": speed}, indent=2))
    _write(ctx.out / "report.md", markdown(env, checks, speed, finished))


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cuda, cuda:N or cpu")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes, few steps: the dry run (well under a minute on a CPU)")
    parser.add_argument("--out", default=None, help="result folder (default: $OUT, else ./gpu-results)")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help="run only these items: an exact name (e.g. pretrain_T128_dense), or the start of "
                             "names (e.g. unpad family_ inference)")
    parser.add_argument("--skip-speed", action="store_true", help="correctness checks only")
    parser.add_argument("--skip-correctness", action="store_true", help="speed only")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="wall seconds after which remaining speed items are skipped (default 420 on a GPU: "
                             "the whole call stays under 8 minutes; unlimited on CPU)")
    parser.add_argument("--compile-backend", default=None,
                        help="torch.compile backend of the compile rows (default inductor; for a quick CPU run "
                             "eager, dynamo's capture alone: inductor's C++ builds would take minutes)")
    return parser.parse_args(argv)


def make_context(args: argparse.Namespace) -> Context:
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"--device {device}: this torch ({torch.__version__}) sees no CUDA device")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
    out = Path(args.out or os.environ.get("OUT") or "gpu-results")
    budget = args.budget_s if args.budget_s is not None else (420.0 if dev.type == "cuda" else float("inf"))
    backend = args.compile_backend or ("eager" if dev.type == "cpu" and args.quick else "inductor")
    return Context(dev, args.quick, out, budget, backend)


def selected(name: str, only: list[str] | None, names: list[str]) -> bool:
    """--only: an item's exact name selects that item alone; anything else selects the names it begins."""
    if only is None:
        return True
    return any(name == word or (word not in names and name.startswith(word)) for word in only)


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' advisory warnings (config ids, attention fallbacks) would bury the one-line progress."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    before, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # "Loading weights" bars of every from_pretrained
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)
        if bars:
            hf_logging.enable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    from bench.gpu import checks, e2e, speed

    args = parse_args(argv)
    ctx = make_context(args)
    env = environment(ctx)
    print(f"bertkit GPU suite on {env['device_name']} ({ctx.device}; torch {env['torch']}, CUDA {env['cuda']}, "
          f"driver {env['driver']}, transformers {env['transformers']}, flash_attn {env['flash_attn']}); "
          f"results in {ctx.out}/", flush=True)
    correctness: list[dict] = []
    measurements: list[dict] = []
    items = speed.plan(ctx) + e2e.plan(ctx)
    names = [name for name, _ in checks.CHECKS] + [name for name, _, _ in items]
    write_results(ctx, env, correctness, measurements, finished=False)
    try:
        run_all(ctx, args, env, correctness, measurements, items, names)
    except KeyboardInterrupt:  # Ctrl-C, or run.sh's time limit: keep what was measured
        write_results(ctx, env, correctness, measurements, finished=False)
        print(f"interrupted after {ctx.elapsed():.0f} s; the items done so far are in {ctx.out}/", flush=True)
        return 130
    write_results(ctx, env, correctness, measurements, finished=True)
    failed = [c["name"] for c in correctness if c["status"] == "failed"]
    counts = {s: sum(c["status"] == s for c in correctness) for s in ("passed", "failed", "skipped")}
    print(f"done in {ctx.elapsed():.0f} s: correctness {counts['passed']} passed, {counts['failed']} failed"
          f"{' (' + ', '.join(failed) + ')' if failed else ''}, {counts['skipped']} skipped; speed "
          f"{sum(m['status'] == 'ok' for m in measurements)} measured, "
          f"{sum(m['status'] == 'failed' for m in measurements)} failed, "
          f"{sum(m['status'] == 'skipped' for m in measurements)} skipped; {ctx.out}/report.md", flush=True)
    return exit_status(correctness)


def run_all(ctx: Context, args: argparse.Namespace, env: dict, correctness: list[dict], measurements: list[dict],
            items: list, names: list[str]) -> None:
    """Every selected check, then every selected speed row, the files rewritten after each."""
    from bench.gpu import checks

    with _quiet_transformers():
        if not args.skip_correctness:
            for name, fn in checks.CHECKS:
                if selected(name, args.only, names):
                    correctness.append(run_item("correctness", name, fn, ctx))
                    write_results(ctx, env, correctness, measurements, finished=False)
        if not args.skip_speed:
            for name, fn, reserve_s in items:
                if not selected(name, args.only, names):
                    continue
                if ctx.remaining() < reserve_s:
                    record = {"name": name, "status": "skipped", "seconds": 0.0,
                              "reason": f"time budget: {max(ctx.remaining(), 0):.0f} s of --budget-s "
                                        f"{ctx.budget_s:.0f} left, this item needs about {reserve_s:.0f} s"}
                    print(progress_line("speed", record), flush=True)
                    measurements.append(record)
                else:
                    measurements.append(run_item("speed", name, fn, ctx))
                write_results(ctx, env, correctness, measurements, finished=False)


if __name__ == "__main__":
    sys.exit(main())
