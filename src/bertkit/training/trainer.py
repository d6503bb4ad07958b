"""THE training loop, shared by pretraining, fine-tuning and distillation.

`train(model, task, batches, config, run_dir)` runs AdamW (or LAMB) with a learning-rate schedule (linear warm-up
and decay, T5's inverse square root, or warmup-stable-decay), gradient accumulation (with an optional batch-size
warm-up), clipping, bf16 autocast, DistributedDataParallel under torchrun, logging, periodic evaluation and atomic,
resumable checkpoints, and stops on steps, tokens or time. What is trained is given by a *task*:

    task.counts(batch)  -> {term: number of items}            known before the forward pass
    task(model, batch)  -> {name: (sum, count)}               summed losses and metrics of one micro-batch

Names ending in `_loss` are loss terms. The optimised loss is, per term, the sum over every micro-batch of the
step on every rank divided by that term's total count: the mean over the global batch, whatever the split into
micro-batches and ranks. This is why 2 processes with half the batch each give the same losses as 1 process.

`batches` yields this rank's micro-batches: dicts of tensors that carry, under "_state", the data position just
after them; `batches.load_state_dict(state)` seeks there. A checkpoint holds model, optimizer, schedule position,
every rank's RNG states and that data position, so a resumed run repeats the uninterrupted one exactly (the files
themselves are `bertkit.checkpoint`'s resume state).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
# Imported for its side effect, before any process group exists: see `end_distributed`.
import torch.distributed.nn.functional  # noqa: F401
from torch import nn

from bertkit.checkpoint import (RESUME_DIR, CheckpointError, latest_checkpoint, load_checkpoint, resume_state_path,
                                rng_state, save_checkpoint, set_rng_state)
from bertkit.config import field_with_help
from bertkit.errors import DataError
from bertkit.io import append_line, atomic_write, read_json_lines, remove_stale_temporaries, writer_lock
from bertkit.models.bert import compile_layers
from bertkit.models.kernels import Linear, pin_choice
from bertkit.models.layouts import attach_host
from bertkit.training.optim import Adafactor, Lamb, param_groups


_f = field_with_help  # a dataclass field with its help text (the CLI options come from these)
SCHEDULES = ("linear", "inverse_sqrt", "wsd")  # TrainConfig.schedule: see `learning_rate`
DECAY_SHAPES = ("linear", "1-sqrt")  # TrainConfig.decay_shape (wsd)
OPTIMIZERS = ("adamw", "lamb", "adafactor")  # TrainConfig.optimizer: see `make_optimizer`
KERNELS_RECORD = "kernels.json"  # in the run directory: the CPU matmul kernel the run used (`pin_choice`)


@dataclass(frozen=True)
class TrainConfig:
    """How to optimise; the defaults are the BERT paper's pretraining recipe for BERT-base."""

    max_steps: int = _f(1_000_000, "optimizer steps; the learning-rate schedule spans them")
    max_time: float | None = _f(None, "stop after this many seconds of training (the schedule then follows time)")
    max_tokens: int | None = _f(None, "stop after this many real (non-padding) tokens")
    learning_rate: float = _f(1e-4, "peak learning rate")
    warmup_steps: int = _f(10_000, "linear warm-up steps (overrides warmup_ratio when > 0)")
    warmup_ratio: float = _f(0.0, "warm-up as a fraction of max_steps, used when warmup_steps is 0")
    schedule: str = _f("linear", "learning-rate schedule: linear (warm-up, then linear decay to 0 at the end of the "
                                 "budget), inverse_sqrt (T5: the peak for the warm-up steps, then peak x "
                                 "sqrt(warm-up / step)) or wsd (warmup-stable-decay: warm-up, the peak, then a "
                                 "decay to 0 over the last decay_fraction of the budget)")
    decay_fraction: float = _f(0.1, "wsd: the last fraction of the budget (steps or time) over which the learning "
                                    "rate decays to 0")
    decay_shape: str = _f("linear", "wsd: the decay's shape, linear or 1-sqrt (peak x (1 - sqrt(r)) at fraction r of "
                                    "the decay, as ModernBERT)")
    batch_warmup_steps: int = _f(0, "batch-size warm-up: the global batch grows from 1 micro-batch per rank to "
                                    "grad_accumulation micro-batches linearly over this many steps (0 = off; needs "
                                    "grad_accumulation > 1)")
    optimizer: str = _f("adamw", "adamw, or lamb (You et al., 2019, as ALBERT pretrains: Adam's update scaled "
                                 "per parameter tensor by ||w|| / ||update||; same betas, epsilon and decay), or "
                                 "adafactor (Shazeer and Stern, 2018, as T5 pretrains: factored second moments, "
                                 "no momentum, the learning rate relative to each tensor's RMS; adam_* unused)")
    weight_decay: float = _f(0.01, "AdamW weight decay; never applied to biases and LayerNorm weights")
    adam_beta1: float = _f(0.9, "AdamW beta1")
    adam_beta2: float = _f(0.999, "AdamW beta2")
    adam_epsilon: float = _f(1e-6, "AdamW epsilon")
    max_grad_norm: float = _f(1.0, "clip the global gradient norm to this (0 = no clipping)")
    grad_accumulation: int = _f(1, "micro-batches per optimizer step on each rank")
    precision: str = _f("auto", "fp32, bf16 (autocast) or auto (bf16 on GPUs that support it, else fp32)")
    log_every: int = _f(10, "write a metrics line every N steps")
    eval_every: int = _f(0, "evaluate every N steps (0 = only at the end)")
    save_every: int = _f(1000, "write a resume checkpoint every N steps (and at the end)")
    keep_last: int = _f(2, "resume checkpoints to keep")
    seed: int = _f(0, "seed for initialisation, data order, masking and dropout")
    device: str = _f("auto", "cpu, cuda, cuda:N or auto")
    compile: bool = _f(False, "torch.compile the encoder layers (eager fallback, with a warning, where it fails)")
    progress: bool = _f(True, "show a progress bar")

    def __post_init__(self) -> None:
        # Every number is checked here, so a bad value stops the run before anything is built or written; NaN
        # fails every comparison, hence the explicit finiteness checks.
        for name in ("learning_rate", "warmup_ratio", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
                     "max_grad_norm") + (("max_time",) if self.max_time is not None else ()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {self.max_steps}")
        if self.max_time is not None and self.max_time <= 0:
            raise ValueError(f"max_time must be a positive number of seconds, got {self.max_time}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.grad_accumulation < 1:
            raise ValueError(f"grad_accumulation must be at least 1, got {self.grad_accumulation}")
        if self.precision not in ("fp32", "bf16", "auto"):
            raise ValueError(f"precision must be fp32, bf16 or auto, got {self.precision!r}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if isinstance(self.decay_fraction, bool) or not isinstance(self.decay_fraction, (int, float)) \
                or not 0.0 < self.decay_fraction <= 1.0:
            raise ValueError(f"decay_fraction must be in (0, 1], got {self.decay_fraction!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.decay_shape not in DECAY_SHAPES:
            raise ValueError(f"decay_shape must be one of {', '.join(DECAY_SHAPES)}, got {self.decay_shape!r}")
        if self.batch_warmup_steps < 0:
            raise ValueError(f"batch_warmup_steps must not be negative, got {self.batch_warmup_steps}")
        if self.batch_warmup_steps > 0 and self.grad_accumulation < 2:
            raise ValueError("batch_warmup_steps grows the batch by micro-batches: set grad_accumulation to the "
                             "number of micro-batches of the full batch (at least 2)")
        for name in ("learning_rate", "weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}"
                                 + (" (0 turns clipping off)" if name == "max_grad_norm" else ""))
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.adam_epsilon <= 0:
            raise ValueError(f"adam_epsilon must be positive, got {self.adam_epsilon}")
        for name in ("warmup_steps", "eval_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("log_every", "save_every", "keep_last"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps > 0 else round(self.warmup_ratio * self.max_steps)


class Task(Protocol):
    def counts(self, batch: dict[str, Any]) -> dict[str, float]: ...

    def __call__(self, model: nn.Module, batch: dict[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]: ...


# ------------------------------------------------------------------------------------------------------------------
# Set-up helpers
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class Distributed:
    """This process's place among the torchrun workers (world_size 1 without torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(device: str = "auto") -> tuple[Distributed, torch.device]:
    """Join the torchrun process group (NCCL on GPU, gloo on CPU) when launched by torchrun; pick the device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    info = Distributed(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and world > 1:
        device = f"cuda:{info.local_rank}"
    dev = check_device(device)
    if dev.type == "cuda":
        if dev.index is None:  # torch.cuda.set_device refuses a bare "cuda"; it means the current device
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", **_attempt_store(info))
    return info, dev


def end_distributed() -> None:
    """The end of a distributed run, the same for every verb: destroy the process group, which frees its backend
    and, for gloo, joins its worker and socket threads, so that none is left when the interpreter shuts down.

    Why this needs care: torch.distributed.nn.functional gives ten functions the default argument
    `group=group.WORLD`, evaluated when the module is first imported. DistributedDataParallel's constructor imports
    it (through torch._dynamo), and imported after init_process_group those defaults hold the default group for
    the life of the process: destroy_process_group then frees nothing, and gloo's threads outlive it. The rank then
    exits with a gloo worker that may still be releasing the tensors of the last collective, whose Python objects
    it must drop under the GIL; when that happens while Python finalizes, the interpreter ends the thread by a
    forced unwind through a noexcept destructor: std::terminate, "terminate called without an active exception",
    SIGABRT, and torchrun then stops the other ranks. It struck at random, more often with the cores busy (the
    worker descheduled between finishing the collective and dropping it). This module imports
    torch.distributed.nn.functional at its top, before `setup_distributed` can create a group, so the defaults
    hold None and the group is really destroyed here (tests/training/test_trainer.py counts the threads).
    """
    if dist.is_initialized():
        dist.destroy_process_group()


def _attempt_store(info: Distributed) -> dict[str, Any]:
    """init_process_group's store for a restarted torchrun job: {} (torch's own) unless torchrun's agent hosts it.

    The agent keeps one store for every attempt of a job (`--max-restarts`), and the process group writes the same
    keys in it each time (every rank's address): a restarted rank could read the address of a rank of the attempt
    before, dead by then, and stop with Gloo's "connectFullMesh failed ... Connection refused" (NCCL passes its
    unique id through the same store); this happened on about one restart in two. Keys under the attempt's own
    prefix fix it.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    from torch.distributed.constants import default_pg_timeout

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), info.world_size,
                          is_master=False, timeout=default_pg_timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return {"store": dist.PrefixStore(f"bertkit/attempt-{attempt}", store), "rank": info.rank,
            "world_size": info.world_size}


def check_device(device: str) -> torch.device:
    """`device` as a torch.device, or ValueError naming --device when it does not exist here (no CUDA, no such
    GPU index, a name torch does not know)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device {device!r}: not a device name (use cpu, cuda, cuda:N or auto)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA support" if torch.version.cuda is None else "no GPU is visible"
            raise ValueError(f"--device {device}: no CUDA GPU is available ({why}); use --device cpu or auto")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"--device {device}: there is no GPU {dev.index} (this machine has "
                             f"{torch.cuda.device_count()})")
    elif dev.type != "cpu":
        raise ValueError(f"--device {device!r}: bertkit trains on cpu or cuda")
    return dev


def use_bf16(precision: str, device: torch.device) -> bool:
    if precision == "bf16":
        return True
    return precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """`config.optimizer`: AdamW, fused (one pass over memory per parameter) where this torch build has the fused
    kernel, or `Lamb`, with the layer-wise trust ratio on the decayed parameters only (see `param_groups`), or
    `Adafactor` (T5's).

    On CPU the fused step is several times faster than the per-operation one, which matters with large
    embedding matrices; it computes the same update.
    """
    groups = param_groups(model, config.weight_decay)
    kwargs = dict(lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_epsilon)
    if config.optimizer == "adafactor":
        return Adafactor(groups, lr=config.learning_rate)
    if config.optimizer == "lamb":
        decay, no_decay = groups
        return Lamb([{**decay, "trust_ratio": True}, {**no_decay, "trust_ratio": False}], **kwargs)
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device or dtype
        return torch.optim.AdamW(groups, **kwargs)


def learning_rate(config: TrainConfig, step: int, elapsed: float) -> float:
    """The learning rate of step `step` (from 0): `config.schedule`.

    linear: linear warm-up to the peak, then linear decay to 0 at the end of the budget. Progress through the
    budget is step / max_steps, or elapsed / max_time when that is larger (a time-bounded run decays on time).
    Warm-up is `warmup_steps` steps, or else the first `warmup_ratio` of the progress.
    inverse_sqrt (T5's 1 / sqrt(max(step, k))): the peak for the first k = warm-up steps, then
    peak x sqrt(k / step); it does not depend on the budget (k = 1 without any warm-up).
    wsd (warmup-stable-decay, the "trapezoidal" schedule of ModernBERT): the same warm-up as linear, then the peak,
    then over the last `decay_fraction` of the progress a decay to 0, linear or 1-sqrt (`decay_shape`); a run
    stopped before the decay has the peak rate throughout its stable phase, so it can be continued and decayed
    later.
    """
    if config.schedule == "inverse_sqrt":
        k = max(config.warmup, 1)
        return config.learning_rate * math.sqrt(k / max(step, k))
    progress = step / config.max_steps
    if config.max_time:
        progress = max(progress, elapsed / config.max_time)
    if config.schedule == "wsd":
        if config.warmup_steps > 0:
            warm = min(1.0, (step + 1) / config.warmup_steps)
        elif config.warmup_ratio > 0:  # counting the step being taken, so the first step does not get 0
            warm = min(1.0, max(progress, (step + 1) / config.max_steps) / config.warmup_ratio)
        else:
            warm = 1.0
        left = min(1.0, max(0.0, (1.0 - progress) / config.decay_fraction))  # of the decay phase, 1 -> 0
        decay = 1.0 - math.sqrt(1.0 - left) if config.decay_shape == "1-sqrt" else left
        return config.learning_rate * min(warm, decay)
    if config.warmup_steps > 0:
        if step < config.warmup_steps:
            return config.learning_rate * (step + 1) / config.warmup_steps
        warm = min(config.warmup_steps / config.max_steps, 0.999)
    else:
        warm = config.warmup_ratio
        if progress < warm:  # counting the step being taken, so the first step does not get 0
            return config.learning_rate * min(1.0, max(progress, (step + 1) / config.max_steps) / warm)
    return config.learning_rate * min(1.0, max(0.0, (1.0 - progress) / (1.0 - warm)))


def micro_batches(config: TrainConfig, step: int) -> int:
    """Micro-batches per rank in optimizer step `step` (from 0): grad_accumulation, or during the batch-size
    warm-up 1 + floor((grad_accumulation - 1) x step / batch_warmup_steps), reaching grad_accumulation at step
    batch_warmup_steps. A function of the step alone, so a resumed run takes the same batches."""
    n = config.batch_warmup_steps
    if n <= 0 or step >= n:
        return config.grad_accumulation
    return 1 + (config.grad_accumulation - 1) * step // n


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------------------------------------------
# Logging
# ------------------------------------------------------------------------------------------------------------------
class MetricsLog:
    """Appends one JSON object per logged step to run_dir/metrics.jsonl (and TensorBoard when installed).

    Each line goes out in one write, cut back on failure, so a full disk leaves no torn line (a `DiskFullError`
    names the file). On resume the lines after the checkpoint's step are dropped (the resumed run logs those steps
    again) and a torn last line left by an older writer or a kill is cut off, with a note.
    """

    def __init__(self, run_dir: Path, resume_step: int | None, enabled: bool) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        self.tb = None
        if not enabled:
            return
        if resume_step is not None and self.path.exists():
            records, torn = read_json_lines(self.path)
            if torn is not None:
                print(f"{self.path}:{torn.line}: removed a torn last line ({torn.text!r}...), left by an "
                      f"interrupted write", file=sys.stderr, flush=True)
            kept = [json.dumps(record) for _, record in records
                    if not isinstance(record, dict) or record.get("step", 0) <= resume_step]
            atomic_write(self.path, "".join(line + "\n" for line in kept))
        elif resume_step is None:
            atomic_write(self.path, "")
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        except Exception:  # tensorboard is optional
            self.tb = None

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        append_line(self.path, json.dumps(record))
        if self.tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


# ------------------------------------------------------------------------------------------------------------------
# The loop
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    step: int
    tokens: int
    elapsed: float
    last_metrics: dict[str, float]
    eval_metrics: dict[str, float]
    stopped_by: str


def _host_group(info: Distributed) -> Any:
    """The process group that sums host numbers (batch counts): the default one when it is gloo, else a gloo
    group beside NCCL's, so counts never travel through the GPU (a device read each step)."""
    if info.world_size == 1:
        return None
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    return dist.new_group(backend="gloo")


def _device_scalar(x: torch.Tensor | float, device: torch.device) -> torch.Tensor:
    """x as a float64 () tensor on `device`; a host number is written by a fill kernel, not copied (a blocking
    host-to-device copy waits for the device's queue)."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).reshape(())
    return torch.full((), float(x), dtype=torch.float64, device=device)


def on_host(state: Any) -> Any:
    """`state` (nested dicts, lists and tuples) with every tensor copied to the host: a checkpoint's data position,
    which may hold an objective's device tensors; read from the device at a save only."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu")
    if isinstance(state, dict):
        return {k: on_host(v) for k, v in state.items()}
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # a named tuple
        return type(state)(*(on_host(v) for v in state))
    if isinstance(state, (list, tuple)):
        return type(state)(on_host(v) for v in state)
    return state


def _move(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The batch on `device`; every moved tensor keeps its host copy (`attach_host`), from which the model takes
    its layout (the attention mask) and the objectives the positions they index (labels, attention mask) without
    reading the device."""
    out = {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and out[key] is not value:
            attach_host(out[key], value)
    return out


def train(model: nn.Module, task: Task, batches: Iterable[dict[str, Any]], config: TrainConfig, run_dir: str | Path,
          evaluate: Callable[[nn.Module], dict[str, float]] | None = None, resume: bool = False,
          on_save: Callable[[nn.Module, int], None] | None = None,
          dist_info: Distributed | None = None, device: torch.device | None = None,
          eval_at_start: bool = False) -> TrainResult:
    """Train `model` on `task` over `batches` until max_steps, max_tokens or max_time; see the module docstring.

    evaluate: called on the plain model (eval mode, no grad) on rank 0 every eval_every steps and at the end; its
    metrics are logged with an "eval_" prefix. on_save: called on rank 0 with the plain model at every checkpoint.
    resume: continue from the newest checkpoint in run_dir/checkpoints (start fresh if there is none).
    eval_at_start: also evaluate before the first step of a fresh run (a "before" figure).

    Rank 0 holds run_dir's lock meanwhile (`bertkit.io.lock_directory`, re-entrant: a verb that already holds it
    keeps it), so no other process writes the run at the same time, and first removes the temporary files and
    staging folders a killed run left there.
    """
    run_dir = Path(run_dir)
    if dist_info is None or device is None:
        dist_info, device = setup_distributed(config.device)
    with writer_lock(run_dir, dist_info.is_main):
        if dist_info.is_main:
            for path in remove_stale_temporaries(run_dir, run_dir / RESUME_DIR):
                print(f"bertkit: removed {path}, left by an interrupted run", file=sys.stderr, flush=True)
        try:
            return _train(model, task, batches, config, run_dir, evaluate, resume, on_save, dist_info, device,
                          eval_at_start)
        except RuntimeError as err:
            # torch's DataLoader reports a dead worker from its SIGCHLD handler, wherever the loop then is
            if "DataLoader worker" not in str(err):
                raise
            raise DataError(f"a data loader worker process of rank {dist_info.rank} died "
                            f"({str(err).splitlines()[0]}); continue from the last checkpoint with --resume") from None


def _train(model: nn.Module, task: Task, batches: Iterable[dict[str, Any]], config: TrainConfig, run_dir: Path,
           evaluate: Callable[[nn.Module], dict[str, float]] | None, resume: bool,
           on_save: Callable[[nn.Module, int], None] | None, dist_info: Distributed, device: torch.device,
           eval_at_start: bool) -> TrainResult:
    run_dir.mkdir(parents=True, exist_ok=True)
    model.to(device)
    if device.type == "cpu" and any(isinstance(m, Linear) and m.onednn == "auto" for m in model.modules()):
        # The CPU matmul kernel of bertkit's layers: chosen here, with the set-up, rather than inside the first step,
        # whose time the first log reports; a resumed run takes the one it recorded (the kernels round differently)
        pin_choice(run_dir / KERNELS_RECORD, resume, write=dist_info.is_main)
    optimizer = make_optimizer(model, config)
    start = _resume(run_dir, model, optimizer, batches, dist_info) if resume else _Start()
    if config.compile:
        compile_layers(model)
    wrapped: nn.Module = model
    if dist_info.world_size > 1:
        wrapped = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    run = _Run(model, optimizer, config, run_dir, dist_info, device, use_bf16(config.precision, device),
               MetricsLog(run_dir, start.step if start.resumed else None, dist_info.is_main), evaluate, on_save,
               start.step, start.tokens, start.elapsed, start.data, _Window(device, start.window))
    progress = _Progress(config, run.step, run.elapsed_before, dist_info.is_main)
    # Counts are host numbers (they come from the batch, before the step); across ranks they are summed over a gloo
    # group, so NCCL runs never read the GPU for them.
    host_group = _host_group(dist_info)
    stream = iter(batches)
    eval_metrics: dict[str, float] = {}
    last: dict[str, float] = {}
    stopped_by = "max_steps"
    if eval_at_start and run.step == 0:
        run.evaluate()
    model.train()
    while run.step < config.max_steps:
        # Take the step's micro-batches first: the loss of each term is normalised by its count over all of them.
        budget = _budget_spent(config, run)
        micro = [] if budget else list(itertools.islice(stream, micro_batches(config, run.step)))
        if not micro:
            stopped_by = budget or "end_of_data"
            break
        run.data_state = micro[-1].get("_state")
        global_counts, step_tokens = _global_counts(task, micro, dist_info, host_group)
        lr = learning_rate(config, run.step, run.elapsed())
        for group in optimizer.param_groups:
            group["lr"] = lr
        sums = _forward_backward(task, wrapped, micro, global_counts, run)
        grad_norm = _optimizer_step(model, optimizer, config.max_grad_norm)
        run.step += 1
        run.tokens += step_tokens
        # Step metrics over the global batch, summed on the device (an all-reduce is queued, nothing is read).
        keys = sorted(sums)
        flat = torch.stack([sums[k] for k in keys])  # (terms, 2)
        if dist_info.world_size > 1:
            dist.all_reduce(flat)
        run.window.add(keys, flat, step_tokens)
        if run.step % config.log_every == 0 or run.step == config.max_steps:
            last = run.window.record(run.step, grad_norm, lr, run.tokens, run.elapsed())
            if config.batch_warmup_steps:  # the batch-size warm-up's current step: micro-batches per rank
                last["micro_batches"] = len(micro)
            run.log.write(last)
        progress.update(run, last, lr)
        if config.eval_every and run.step % config.eval_every == 0 and run.step < config.max_steps:
            eval_metrics = run.evaluate()
        if run.step % config.save_every == 0 and run.step < config.max_steps:
            run.save()
    progress.close()
    if hasattr(stream, "close"):  # stop a prefetching stream's worker now, not at interpreter exit
        stream.close()
    run.save()
    if run.evaluated_at != run.step:  # a run stopped by time right after an evaluation has its last one already
        eval_metrics = run.evaluate() or eval_metrics
    run.log.close()
    return TrainResult(run.step, run.tokens, run.elapsed(), last, eval_metrics, stopped_by)


def _budget_spent(config: TrainConfig, run: _Run) -> str | None:
    """"max_time" or "max_tokens" when that budget is spent before the next step, else None."""
    if config.max_time is not None and run.elapsed() >= config.max_time:
        return "max_time"
    if config.max_tokens is not None and run.tokens >= config.max_tokens:
        return "max_tokens"
    return None


# The keys of a resume state this loop writes; `_resume` refuses a file without them.
RESUME_KEYS = ("step", "tokens", "elapsed", "model", "optimizer", "data", "rng", "config", "window")


@dataclass
class _Start:
    """Where a run starts: a fresh run at 0, a resumed one at its checkpoint's counters, data position and open
    metrics window."""

    step: int = 0
    tokens: int = 0
    elapsed: float = 0.0
    data: Any = None
    window: dict[str, Any] | None = None
    resumed: bool = False


def _resume(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, batches: Any,
            dist_info: Distributed) -> _Start:
    """Load the newest checkpoint of run_dir into the model, the optimizer, the data stream (this rank's position)
    and the RNG; a fresh start (with a note) when there is none. CheckpointError naming the file when it lacks a
    field of RESUME_KEYS (a resume state of another program, or of a bertkit before the metrics window was saved)."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        if dist_info.is_main:
            print(f"bertkit: resume: {run_dir} holds no checkpoint (a new or empty run directory); starting a fresh "
                  f"run", file=sys.stderr, flush=True)
        return _Start()
    state = load_checkpoint(checkpoint)
    missing = [key for key in RESUME_KEYS if key not in state]
    if not missing and not isinstance(state["window"].get("losses"), dict):
        missing = ["window losses (sum, steps)"]
    if missing:
        raise CheckpointError(f"{checkpoint}: not a resume state of this bertkit (no {', '.join(missing)}); start "
                              f"the run afresh without --resume")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    # Each rank's own position (a checkpoint of one process holds one for all)
    data = state["data_ranks"][dist_info.rank] if "data_ranks" in state else state["data"]
    batches.load_state_dict(data)
    set_rng_state(state["rng"][dist_info.rank])
    if dist_info.is_main:
        print(f"resuming from {checkpoint} (step {state['step']})", flush=True)
    return _Start(state["step"], state["tokens"], state["elapsed"], state["data"], state["window"], resumed=True)


class _Window:
    """The open metrics window, on the device: per term (sum, count) as a (2,) float64 tensor, the sum of the steps'
    losses; read only when a line is logged or a checkpoint is written. A checkpoint carries it (`state`), so the
    first line a resumed run logs averages the same steps as the uninterrupted run's."""

    def __init__(self, device: torch.device, state: dict[str, Any] | None = None) -> None:
        self.device = device
        self.reset(time.perf_counter())
        if state is not None:
            self.sums = {k: torch.tensor([float(x) for x in v], dtype=torch.float64, device=device)
                         for k, v in state["sums"].items()}
            self.loss.fill_(float(state["losses"]["sum"]))
            self.steps = int(state["losses"]["steps"])
            self.tokens = int(state["tokens"])

    def reset(self, now: float) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self.steps, self.tokens, self.start = 0, 0, now

    def add(self, keys: list[str], flat: torch.Tensor, step_tokens: int) -> None:
        """One step's global (sum, count) per term (`flat`: (terms, 2), rows in the order of `keys`)."""
        step_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        for j, k in enumerate(keys):
            self.sums[k] = self.sums[k] + flat[j] if k in self.sums else flat[j].clone()
            if k.endswith("_loss"):
                step_loss = step_loss + flat[j, 0] / flat[j, 1].clamp(min=1.0)
        self.loss = self.loss + step_loss
        self.steps += 1
        self.tokens += step_tokens

    def record(self, step: int, grad_norm: torch.Tensor, lr: float, tokens: int, elapsed: float) -> dict[str, Any]:
        """The metrics line of the window ending at `step`, then an empty window. The one read of the device
        between log steps: the window's terms, its loss and the gradient norm. FloatingPointError when the mean
        loss is not finite."""
        now = time.perf_counter()
        names = list(self.sums)
        values = torch.cat([torch.stack([self.sums[k] for k in names]).reshape(-1) if names
                            else self.loss.new_zeros(0), self.loss.reshape(1),
                            grad_norm.detach().to(torch.float64).reshape(1)]).tolist()
        mean_loss = values[-2] / max(self.steps, 1)
        if not math.isfinite(mean_loss):
            raise FloatingPointError(f"the loss became {mean_loss} by step {step} (the average of steps "
                                     f"{step - self.steps + 1}-{step}); lower the learning rate or check the data")
        record: dict[str, Any] = {"step": step, "loss": mean_loss}
        for j, k in enumerate(names):
            record[k] = values[2 * j] / max(values[2 * j + 1], 1.0)
        record.update(lr=lr, grad_norm=values[-1], tokens=tokens,
                      tokens_per_s=self.tokens / max(now - self.start, 1e-9), elapsed_s=elapsed)
        self.reset(now)
        return record

    def state(self) -> dict[str, Any]:
        return {"sums": {k: v.tolist() for k, v in self.sums.items()},
                "losses": {"sum": float(self.loss), "steps": self.steps}, "tokens": self.tokens}


@dataclass
class _Run:
    """What the loop's evaluation and saving read: the fixed pieces and the counters the loop advances."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    config: TrainConfig
    run_dir: Path
    dist_info: Distributed
    device: torch.device
    bf16: bool
    log: MetricsLog
    evaluate_fn: Callable[[nn.Module], dict[str, float]] | None
    on_save: Callable[[nn.Module, int], None] | None
    step: int
    tokens: int
    elapsed_before: float
    data_state: Any  # the data position just after the last batch taken
    window: _Window
    evaluated_at: int = -1  # the step of the last evaluation: the one at the end is not repeated
    started: float = dataclasses.field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.started

    def evaluate(self) -> dict[str, float]:
        """evaluate_fn's metrics ("eval_" prefixed) on rank 0, logged; the other ranks wait at the barrier."""
        metrics: dict[str, float] = {}
        self.evaluated_at = self.step
        if self.evaluate_fn is not None and self.dist_info.is_main:
            was_training = self.model.training
            self.model.eval()
            with torch.no_grad(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                metrics = {f"eval_{k}": float(v) for k, v in self.evaluate_fn(self.model).items()}
            self.model.train(was_training)
            self.log.write({"step": self.step, **metrics})
        if self.dist_info.world_size > 1:
            dist.barrier()
        return metrics

    def save(self) -> None:
        """A resume checkpoint of the step (rank 0 writes it, with every rank's RNG and data position), then
        on_save."""
        rng = [rng_state()]
        # an objective's state in the data position (XLNet's memory, ELMo's LSTM state) may be the device's
        data = [on_host(self.data_state)]
        world = self.dist_info.world_size
        if world > 1:
            # Every rank's RNG and data position: a rank's stream makes only its own rows, so its position is its own
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, (rng[0], data[0]))
            rng, data = [g[0] for g in gathered], [g[1] for g in gathered]
        if self.dist_info.is_main:
            state = {"step": self.step, "tokens": self.tokens, "elapsed": self.elapsed(),
                     "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "data": data[0],
                     "rng": rng, "config": dataclasses.asdict(self.config), "window": self.window.state()}
            if world > 1:
                state["data_ranks"] = data
            save_checkpoint(resume_state_path(self.run_dir, self.step), state, self.config.keep_last)
            if self.on_save is not None:
                self.on_save(self.model, self.step)
        if world > 1:
            dist.barrier()


def _global_counts(task: Task, micro: list[dict[str, Any]], dist_info: Distributed,
                   host_group: Any) -> tuple[dict[str, float], int]:
    """Per term, its count over the step's micro-batches on every rank (at least 1), and the real tokens of the
    global batch; from the host arrays (the batches are still where the loader left them)."""
    counts: dict[str, float] = {}
    real_tokens = 0
    for b in micro:
        for k, v in task.counts(b).items():
            counts[k] = counts.get(k, 0.0) + float(v)
        real_tokens += int(b["attention_mask"].ne(0).sum())
    names = sorted(counts)
    totals = [counts[k] for k in names] + [float(real_tokens)]
    if dist_info.world_size > 1:
        reduced = torch.tensor(totals, dtype=torch.float64)
        dist.all_reduce(reduced, group=host_group)
        totals = reduced.tolist()
    return {k: max(totals[i], 1.0) for i, k in enumerate(names)}, int(totals[-1])


def _forward_backward(task: Task, wrapped: nn.Module, micro: list[dict[str, Any]], global_counts: dict[str, float],
                      run: _Run) -> dict[str, torch.Tensor]:
    """Forward and backward over the step's micro-batches (DDP syncs on the last); per term the (2,) device
    tensor (sum, count) over them."""
    world, device = run.dist_info.world_size, run.device
    sums: dict[str, torch.Tensor] = {}
    for i, b in enumerate(micro):
        # The key of this micro-batch's random draws made on the device (ELECTRA's samples): (seed, step,
        # micro-batch, first global row), the same for a row whatever the number of ranks
        b = _move({**b, "_draw": (run.config.seed, run.step, i, run.dist_info.rank * len(b["attention_mask"]))},
                  device)
        sync = i == len(micro) - 1 or world == 1
        with contextlib.nullcontext() if sync else wrapped.no_sync():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=run.bf16):
                out = task(wrapped, b)
            loss = sum(out[k][0].float() / global_counts[k] for k in out if k.endswith("_loss"))
            (loss * world).backward()  # DDP averages gradients over ranks; undo that
        for k, (value, count) in out.items():
            pair = torch.stack([_device_scalar(value, device), _device_scalar(count, device)])
            sums[k] = sums[k] + pair if k in sums else pair
    return sums


def _optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> torch.Tensor:
    """Clip the gradients to max_grad_norm (0: no clipping), step and clear them; the gradient norm before
    clipping, which stays a device tensor (clip_grad_norm_ scales by min(1, max / norm) on the device)."""
    if max_grad_norm > 0:
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    else:
        grad_norm = torch.norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


class _Progress:
    """The progress bar of rank 0 (none elsewhere, or with progress off): steps, or seconds under a time budget
    (so its ETA is the budget's end)."""

    def __init__(self, config: TrainConfig, step: int, elapsed_before: float, enabled: bool) -> None:
        self.config = config
        self.bar = None
        if not (config.progress and enabled):
            return
        from tqdm.auto import tqdm

        if config.max_time:
            self.bar = tqdm(total=round(config.max_time), initial=round(elapsed_before), unit="s",
                            dynamic_ncols=True, desc="training",
                            bar_format="{l_bar}{bar}| {n:.0f}/{total_fmt}s [{elapsed}<{remaining}{postfix}]")
        else:
            self.bar = tqdm(total=config.max_steps, initial=step, unit="step", dynamic_ncols=True,
                            desc="training", smoothing=0.05)

    def update(self, run: _Run, last: dict[str, Any], lr: float) -> None:
        """After a step; `last` is the newest metrics line (shown when it is the step's)."""
        if self.bar is None:
            return
        if last.get("step") == run.step:
            self.bar.set_postfix(loss=f"{last['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{last['tokens_per_s']:.0f}",
                                 refresh=False)
        if self.config.max_time:
            self.bar.set_postfix_str(f"step {run.step}" + (f", loss {last.get('loss', float('nan')):.3f}"
                                                           if last else ""), refresh=False)
            self.bar.update(min(round(run.elapsed()), round(self.config.max_time)) - self.bar.n)
        else:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
