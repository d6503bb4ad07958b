"""Kernel choices for the models' matmuls and activations.

`linear` is the one place a float32 CPU matmul picks its kernel: oneDNN's where it is faster (AVX-512 CPUs not made
by Intel run MKL's AVX2 code), `F.linear` elsewhere. `Linear` is `nn.Linear` routed through it; every model layer
uses it, so one switch (`set_fast_paths(model, onednn=...)`) changes them all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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
# not made by Intel run MKL's AVX2 kernels) they are about twice as fast, with float32 rounding alike.
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
           onednn: bool = True) -> torch.Tensor:
    """F.linear(x, weight, bias), on oneDNN (`OneDNNLinear`) for float32 on the CPU outside autocast and
    torch.compile (which lowers its own matmuls) when the product is large enough; `onednn=False` is the plain
    path. Same numbers within float32 rounding (tests/test_fastpaths.py)."""
    if (onednn and _ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32
            and weight.dtype == torch.float32 and x.numel() * weight.shape[0] >= ONEDNN_MIN_MACS
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling()):
        return OneDNNLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear computed by `linear`: the `onednn` switch (`set_fast_paths`) picks oneDNN's kernels."""

    onednn = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.onednn)
