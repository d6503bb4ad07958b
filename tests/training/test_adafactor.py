"""Adafactor (bertkit.training.optim.Adafactor), T5's optimizer: factored second moments, the decay 1 - t^-0.8, update
clipping and the relative step, against values worked out by hand and against transformers' implementation; the
trainer builds it from `optimizer: adafactor`."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from bertkit.training.optim import Adafactor
from bertkit.training.trainer import TrainConfig, make_optimizer


def one_step(w: list, g: list, lr: float = 0.01, optimizer: Adafactor | None = None, **kwargs) -> torch.Tensor:
    p = nn.Parameter(torch.tensor(w, dtype=torch.float64))
    optimizer = optimizer or Adafactor([p], lr=lr, **kwargs)
    p.grad = torch.tensor(g, dtype=torch.float64)
    optimizer.step()
    return p.detach()


def test_first_step_of_a_matrix_by_hand():
    # beta2 = 1 - 1^-0.8 = 0: the moments are this step's. G = g^2 = [[1, 4], [9, 16]]; row means R = [2.5, 12.5],
    # column means C = [5, 10], V = R C^T / mean(R) = [[5/3, 10/3], [25/3, 50/3]], u = g / sqrt(V), so
    # u^2 = [[3/5, 6/5], [27/25, 24/25]], RMS(u) = sqrt(0.96) < 1 (no clipping). Step: 0.01 x RMS(w) = 0.01 x
    # sqrt(1.375).
    w = [[0.5, -0.5], [1.0, 2.0]]
    u = torch.tensor([[0.6, 1.2], [1.08, 0.96]], dtype=torch.float64).sqrt()
    want = torch.tensor(w, dtype=torch.float64) - 0.01 * math.sqrt(1.375) * u
    assert torch.allclose(one_step(w, [[1.0, 2.0], [3.0, 4.0]]), want, atol=1e-12)


def test_vector_clipping_and_the_smallest_scale_by_hand():
    # A vector keeps full second moments. Step 1: V = g^2 = [9, 16], u = [1, 1]. Step 2: beta2 = 1 - 2^-0.8; the
    # gradient ten times larger gives u = [1, 1] x 10 / sqrt(beta2 + 100 (1 - beta2)) in both places, RMS > 1, so
    # clipping brings it back to [1, 1]. RMS(w) stays below 1e-3: every step is lr x 1e-3.
    p = nn.Parameter(torch.tensor([1e-4, 0.0], dtype=torch.float64))
    optimizer = Adafactor([p], lr=0.5)
    for g in ([3.0, 4.0], [30.0, 40.0]):
        p.grad = torch.tensor(g, dtype=torch.float64)
        optimizer.step()
    beta2 = 1 - 2 ** -0.8
    assert 10 / math.sqrt(beta2 + 100 * (1 - beta2)) > 1  # the step-2 update before clipping
    assert torch.allclose(p.detach(), torch.tensor([1e-4 - 2 * 0.5e-3, -2 * 0.5e-3], dtype=torch.float64),
                          atol=1e-15)
    assert torch.allclose(optimizer.state[p]["second"],
                          torch.tensor([9 * beta2 + 900 * (1 - beta2), 16 * beta2 + 1600 * (1 - beta2)],
                                       dtype=torch.float64) + 1e-30, rtol=1e-12)


def test_no_parameter_scale_and_weight_decay():
    # scale_parameter off: the step is lr itself; decay subtracts weight_decay x step x w, decoupled.
    got = one_step([2.0, -2.0], [1.0, -1.0], lr=0.1, scale_parameter=False, weight_decay=0.5)
    assert torch.allclose(got, torch.tensor([2.0 - 0.1 * (1 + 1.0), -2.0 - 0.1 * (-1 - 1.0)], dtype=torch.float64))


def test_matches_transformers_over_steps():
    optimization = pytest.importorskip("transformers.optimization")
    torch.manual_seed(0)
    shapes = [(3, 5, 4), (6, 7), (5,), ()]
    ours = [nn.Parameter(torch.randn(s)) for s in shapes]
    theirs = [nn.Parameter(p.detach().clone()) for p in ours]
    a = Adafactor(ours, lr=0.03)
    b = optimization.Adafactor(theirs, lr=0.03, scale_parameter=True, relative_step=False, warmup_init=False,
                               clip_threshold=1.0, decay_rate=-0.8, beta1=None, weight_decay=0.0)
    for step in range(6):
        for p, q in zip(ours, theirs):
            p.grad = torch.randn(p.shape) * (10.0 if step == 3 else 1.0)  # a jump: clipping acts
            q.grad = p.grad.clone()
        a.step()
        b.step()
        for p, q in zip(ours, theirs):
            assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), (step, p.shape)


def test_the_trainer_builds_it():
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    optimizer = make_optimizer(model, TrainConfig(optimizer="adafactor", learning_rate=0.01, weight_decay=0.0))
    assert isinstance(optimizer, Adafactor) and optimizer.defaults["lr"] == 0.01
    assert sum(len(g["params"]) for g in optimizer.param_groups) == 4
    with pytest.raises(ValueError, match="adafactor"):
        TrainConfig(optimizer="adafactr")
