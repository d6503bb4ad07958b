"""Kernel choices for the models' matmuls and activations.

`linear` is the one place a float32 CPU matmul picks its kernel: oneDNN's where it is measurably faster on this
machine, `F.linear` (torch's default BLAS) elsewhere. Which one wins depends on the CPU: on AMD's AVX-512 CPUs MKL
runs its AVX2 code and oneDNN is about twice as fast; on Intel's, MKL's own kernels are as fast or faster. So the
choice is measured once per process (`linear_choice`: both kernels timed, forward and backward, at BERT-base
shapes: 6 x 1.1 G multiply-adds, about 1 s on 2 busy shared cores) unless BERTKIT_LINEAR=onednn|plain says.
`Linear` is `nn.Linear` routed through it; every model layer uses it, so one switch (`set_fast_paths(model,
onednn=...)`: True forces oneDNN, False the plain path, "auto" the measured choice, the default) changes them all.

The two kernels round differently, so a run's numbers depend on the choice. Where their times are close a fresh
measurement could go either way from one process to the next, and the same seed would train two different models:
so the measured choice is kept per machine (CPU, torch version, threads) in a small cache file
(`$BERTKIT_CACHE_DIR`, else `$XDG_CACHE_HOME/bertkit`, else `~/.cache/bertkit`: linear-choice.json) that every later
process on that machine reads instead of measuring, and a training run records the choice it used in its run
directory (`pin_choice`), which a resumed run takes whatever this process would choose.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.io import atomic_write


def activation(name: str):
    """The activation function called `name` in transformers' configs."""
    if name == "gelu":
        return F.gelu  # exact, erf-based: what BERT was trained with
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    if name in ("silu", "swish"):
        return F.silu
    raise ValueError(f"unknown activation {name!r}")


# oneDNN's float32 matmul kernels: on CPUs where torch's default BLAS (MKL) takes a slower code path (AVX-512 CPUs
# not made by Intel run MKL's AVX2 kernels) they are about twice as fast, with float32 rounding alike; elsewhere
# they can be slower (`linear_choice` measures).
ONEDNN_MIN_MACS = 1 << 22  # below this many multiply-adds a call's fixed cost outweighs the faster kernel


def _onednn_mm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) @ weight (N, K)^T + bias (N) on oneDNN; strided views are read as they are, without a copy."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _onednn_works() -> bool:
    """Whether this torch build has the oneDNN linear kernel and it computes a known product (the operator is
    torch's internal one, so a build without it, or with another signature, falls back to F.linear)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    try:
        product = _onednn_mm(torch.ones(2, 3), torch.ones(4, 3), torch.zeros(4))
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return torch.equal(product, torch.full((2, 4), 3.0))


_ONEDNN = _onednn_works()

# oneDNN is chosen only when it is this much faster than F.linear (the rest is timing noise on a busy machine).
ONEDNN_MARGIN = 0.9
# The measured shapes: 128 tokens through BERT-base's (768, 768) and (3072, 768) weights, forward and backward.
PROBE_SHAPES = ((128, 768, 768), (128, 768, 3072))
_CHOICE: dict | None = None


def choose_kernel(onednn_s: float, plain_s: float) -> str:
    """"onednn" when its time is under ONEDNN_MARGIN x the plain time, else "plain" (never slower than F.linear)."""
    return "onednn" if onednn_s < ONEDNN_MARGIN * plain_s else "plain"


def _probe_times(rounds: int = 2) -> tuple[float, float]:
    """(oneDNN seconds, F.linear seconds): the best of `rounds` interleaved rounds of the three matmuls of a linear
    layer's forward and backward (output, input gradient, weight gradient) at PROBE_SHAPES, this process's
    threads."""
    g = torch.Generator().manual_seed(0)
    cases = [(torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(m, n, generator=g))
             for m, k, n in PROBE_SHAPES]

    def onednn() -> None:
        for x, w, grad in cases:
            _onednn_mm(x, w), _onednn_mm(grad, w.t()), _onednn_mm(grad.t(), x.t())

    def plain() -> None:
        for x, w, grad in cases:
            F.linear(x, w), grad @ w, grad.t() @ x

    best = {onednn: float("inf"), plain: float("inf")}
    with torch.no_grad():
        for fn in best:  # warm-up: first calls create oneDNN primitives and touch the memory
            fn()
        for _ in range(rounds):
            for fn in best:
                start = time.perf_counter()
                fn()
                best[fn] = min(best[fn], time.perf_counter() - start)
    return best[onednn], best[plain]


def cache_path() -> Path:
    """The file that keeps this machine's measured choices (see the module docstring)."""
    root = os.environ.get("BERTKIT_CACHE_DIR")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "bertkit")
    return Path(root) / "linear-choice.json"


def machine_key() -> str:
    """What the choice depends on: the CPU (model name and flags), torch's version and this process's threads."""
    cpu = platform.processor() or platform.machine()
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
        named = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in lines if ":" in line}
        cpu = named.get("model name", cpu) + " " + named.get("flags", "")
    except OSError:
        pass
    digest = hashlib.sha256(cpu.encode("utf-8")).hexdigest()[:16]
    return f"{digest}/torch-{torch.__version__}/threads-{torch.get_num_threads()}"


def _read_cache() -> dict:
    try:
        data = json.loads(cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(key: str, choice: dict) -> None:
    """Adds this machine's choice to the cache file, atomically; a cache that cannot be written is skipped."""
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({**_read_cache(), key: choice}, indent=1, sort_keys=True))
    except OSError:
        pass


def linear_choice() -> dict:
    """The float32 CPU kernel `linear` uses when a layer's switch is "auto", chosen once per process:
    {"kernel": "onednn" | "plain", "reason": ..., and where measured "onednn_ms", "plain_ms"}.

    BERTKIT_LINEAR=onednn or plain decides without measuring (auto, the default, measures); ValueError for
    another value. Without a working oneDNN kernel in this torch build the answer is plain.
    """
    global _CHOICE
    if _CHOICE is not None:
        return _CHOICE
    wanted = os.environ.get("BERTKIT_LINEAR", "auto").strip().lower() or "auto"
    if wanted not in ("auto", "onednn", "plain"):
        raise ValueError(f"BERTKIT_LINEAR must be auto, onednn or plain, got {wanted!r}")
    if not _ONEDNN:
        choice = {"kernel": "plain", "reason": "this torch build has no working oneDNN linear kernel"}
    elif wanted != "auto":
        choice = {"kernel": wanted, "reason": f"BERTKIT_LINEAR={wanted}"}
    else:
        key = machine_key()
        kept = _read_cache().get(key)
        if isinstance(kept, dict) and kept.get("kernel") in ("onednn", "plain"):
            choice = {**kept, "reason": f"measured earlier on this machine ({cache_path()})"}
        else:
            onednn_s, plain_s = _probe_times()
            choice = {"kernel": choose_kernel(onednn_s, plain_s), "reason": "measured",
                      "onednn_ms": round(onednn_s * 1e3, 2), "plain_ms": round(plain_s * 1e3, 2),
                      "threads": torch.get_num_threads()}
            _write_cache(key, {k: v for k, v in choice.items() if k != "reason"})
    _CHOICE = choice
    return choice


def pin_choice(record: Path, resume: bool, write: bool = True) -> dict:
    """The kernel choice of a training run whose record is `record` (a JSON file in its run directory): a resumed
    run takes the recorded one (plain where this torch has no oneDNN kernel), whatever this process would choose;
    otherwise this process's choice, written to the record when `write` (the main rank)."""
    global _CHOICE
    if resume and record.is_file():
        try:
            kernel = json.loads(record.read_text(encoding="utf-8"))["kernel"]
        except (OSError, ValueError, KeyError, TypeError):
            kernel = None
        if kernel in ("onednn", "plain"):
            if kernel == "onednn" and not _ONEDNN:
                kernel = "plain"
            _CHOICE = {"kernel": kernel, "reason": f"recorded by the run ({record})"}
            return _CHOICE
    choice = linear_choice()
    if write:
        try:
            atomic_write(record, json.dumps({"kernel": choice["kernel"]}))
        except OSError:
            pass
    return choice


class OneDNNLinear(torch.autograd.Function):
    """F.linear with all three matmuls (the output and both gradients) on oneDNN's float32 kernels."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn_mm(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        rows = grad.reshape(-1, grad.shape[-1])  # (M, N)
        if ctx.needs_input_grad[0]:
            grad_x = _onednn_mm(grad, weight.t())  # (..., N) @ (N, K)
        if ctx.needs_input_grad[1]:
            grad_weight = _onednn_mm(rows.t(), x.reshape(-1, x.shape[-1]).t())  # (N, M) @ (M, K)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = rows.sum(0)
        return grad_x, grad_weight, grad_bias


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           onednn: bool | str | None = "auto") -> torch.Tensor:
    """F.linear(x, weight, bias), on oneDNN (`OneDNNLinear`) for float32 on the CPU outside autocast and
    torch.compile (which lowers its own matmuls) when the product is large enough and `onednn` is True, or "auto"
    (None alike) and `linear_choice()` measured oneDNN faster on this machine; `onednn=False` is the plain path.
    Same numbers within float32 rounding (tests/models/test_fastpaths.py)."""
    if (onednn is not False and _ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32
            and weight.dtype == torch.float32 and x.numel() * weight.shape[0] >= ONEDNN_MIN_MACS
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling()
            and (onednn is True or linear_choice()["kernel"] == "onednn")):
        return OneDNNLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear computed by `linear`: the `onednn` switch (`set_fast_paths`) picks the kernel ("auto": the
    measured choice; True: oneDNN; False: F.linear)."""

    onednn: bool | str = "auto"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.onednn)
