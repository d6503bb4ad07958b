"""The optimizers the training loop builds beside torch's AdamW: LAMB (ALBERT's) and Adafactor (T5's), each a
`PerTensorOptimizer` (a step that treats each parameter tensor on its own), and the weight-decay groups all of
them take (`param_groups`). `bertkit.training.trainer.make_optimizer` chooses among them from the TrainConfig."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices and embeddings only: not on biases or norm parameters (as in BERT)."""
    decay, no_decay = [], []
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            # Norm scales (LayerNorm, and T5's RMS norm, which marks itself `is_norm`) are not decayed either.
            if isinstance(module, nn.LayerNorm) or getattr(module, "is_norm", False) or name.endswith("bias"):
                no_decay.append(param)
            else:
                decay.append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class PerTensorOptimizer(torch.optim.Optimizer):
    """An optimizer whose step treats each parameter tensor on its own: `step` walks the groups and calls
    `update(p, group, state)` for every parameter with a gradient (LAMB and Adafactor below)."""

    def update(self, p: torch.Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.update(p, group, self.state[p])
        return loss


class Lamb(PerTensorOptimizer):
    """LAMB (You et al., 2019, "Large batch optimization for deep learning", algorithm 2), as ALBERT and NVIDIA's
    BERT pretrain with it. For each parameter tensor w with gradient g, at step t (from 1):

        m = beta1 m + (1 - beta1) g               v = beta2 v + (1 - beta2) g^2
        r = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)     Adam's direction, bias-corrected
        u = r + weight_decay w                    decoupled weight decay, as AdamW
        w = w - lr x trust x u,   trust = ||w|| / ||u||   (2-norms over the whole tensor: the "layer")

    trust is 1 where ||w|| or ||u|| is 0 (a tensor initialised to zeros still moves; a zero update stays zero),
    and in a group with `trust_ratio` False (bertkit puts biases and norm scales there, the parameters without
    weight decay: ALBERT's `exclude_from_layer_adaptation`, NVIDIA's default), where the step is AdamW's.
    """

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, trust_ratio: bool = True) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      trust_ratio=trust_ratio))

    def update(self, p: torch.Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        beta1, beta2 = group["betas"]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        t = float(state["step"])
        m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        update = (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt_().add_(group["eps"]))
        if group["weight_decay"]:
            update.add_(p, alpha=group["weight_decay"])
        if group["trust_ratio"]:  # on the device: no host synchronisation per tensor
            w_norm, u_norm = p.norm(), update.norm()
            update.mul_(torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm)))
        p.add_(update, alpha=-group["lr"])


class Adafactor(PerTensorOptimizer):
    """Adafactor (Shazeer and Stern, 2018, "Adafactor: adaptive learning rates with sublinear memory cost"), with
    the settings T5 pretrains with (Mesh TensorFlow's AdafactorOptimizer defaults). For each parameter tensor w
    with gradient g, at step t (from 1):

        beta2 = 1 - t^-decay_rate                           (decay_rate 0.8)
        G = g^2 + eps1                                      (eps1 1e-30)
        matrices (the last two dimensions), factored:       R = beta2 R + (1 - beta2) mean of G over columns
                                                            C = beta2 C + (1 - beta2) mean of G over rows
                                                            V = R C^T / mean(R)   (rank one, never stored)
        vectors and scalars:                                V = beta2 V + (1 - beta2) G
        u = g / sqrt(V);   u = u / max(1, RMS(u) / clip_threshold)      update clipping (threshold 1)
        w = w - a u,   a = lr x max(eps2, RMS(w))           relative step (eps2 1e-3; lr x 1 without
                                                            scale_parameter)

    lr is the relative step size: T5's inverse-square-root schedule is the trainer's `inverse_sqrt` schedule with
    learning_rate 0.01 and 10,000 warm-up steps (1 / sqrt(max(t, 10^4))). No momentum (beta1 0, T5's choice);
    weight_decay, where a group has it, subtracts weight_decay x a x w, decoupled as AdamW does.
    """

    def __init__(self, params: Any, lr: float = 1e-2, eps: tuple[float, float] = (1e-30, 1e-3),
                 clip_threshold: float = 1.0, decay_rate: float = 0.8, scale_parameter: bool = True,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, dict(lr=lr, eps=eps, clip_threshold=clip_threshold, decay_rate=decay_rate,
                                      scale_parameter=scale_parameter, weight_decay=weight_decay))

    @staticmethod
    def _rms(x: torch.Tensor) -> torch.Tensor:
        return x.norm(2) / (x.numel() ** 0.5)

    def update(self, p: torch.Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        eps1, eps2 = group["eps"]
        dtype = torch.promote_types(p.dtype, torch.float32)  # half-precision weights update in float32
        g = p.grad.to(dtype)
        factored = g.dim() >= 2
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            if factored:
                state["row"] = torch.zeros(g.shape[:-1], dtype=dtype, device=g.device)
                state["col"] = torch.zeros(g.shape[:-2] + g.shape[-1:], dtype=dtype, device=g.device)
            else:
                state["second"] = torch.zeros_like(g)
        state["step"] += 1
        beta2 = 1.0 - float(state["step"]) ** -group["decay_rate"]
        squared = g * g + eps1
        if factored:
            row, col = state["row"], state["col"]
            row.mul_(beta2).add_(squared.mean(dim=-1), alpha=1.0 - beta2)  # (..., rows)
            col.mul_(beta2).add_(squared.mean(dim=-2), alpha=1.0 - beta2)  # (..., columns)
            row_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt().unsqueeze(-1)
            update = g * row_factor * col.unsqueeze(-2).rsqrt()
        else:
            second = state["second"]
            second.mul_(beta2).add_(squared, alpha=1.0 - beta2)
            update = g * second.rsqrt()
        update.div_((self._rms(update) / group["clip_threshold"]).clamp(min=1.0))
        w = p.to(dtype)
        scale = group["lr"] * (torch.clamp(self._rms(w), min=eps2) if group["scale_parameter"] else 1.0)
        if group["weight_decay"]:
            update.add_(w, alpha=group["weight_decay"])
        p.copy_(w - scale * update)
