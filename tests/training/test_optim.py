"""bertkit.training.optim: the optimizers the trainer builds beside AdamW.

LAMB: two steps equal to the paper's update rule worked out by hand, the zero-norm rules, the parameters without
weight decay and trust ratio, selection from a recipe / the fine-tuning options, and a resumed LAMB run repeating the
uninterrupted one. Adafactor, T5's optimizer: factored second moments, the decay 1 - t^-0.8, update clipping and the
relative step, against values worked out by hand and against transformers' implementation; the trainer builds it
from `optimizer: adafactor`."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from bertkit.training.optim import Adafactor, Lamb
from bertkit.training.trainer import TrainConfig, make_optimizer, train
from test_trainer import Regression, Stream, linear, regression_batches


# ---- LAMB ------------------------------------------------------------------------------------------------------
LR, WD, EPS = 0.1, 0.01, 1e-6  # betas (0.9, 0.999) throughout


def test_two_steps_equal_the_update_rule_worked_by_hand():
    """w = (3, 4), gradients (0.6, -0.8) then (0.3, 0.4), lr 0.1, decay 0.01, eps 1e-6.

    Step 1: m = 0.1 g, v = 0.001 g^2, bias-corrected m^ = g, v^ = g^2, so r = g / (|g| + 1e-6)
            = (0.99999833..., -0.99999875...); u = r + 0.01 w = (1.02999833..., -0.95999875...);
            ||w|| = 5, ||u|| = 1.40801071..., trust = 3.55110934...; w - 0.1 x trust x u = (2.63423633, 4.34090605).
    Step 2: m = 0.9 (0.06, -0.08) + 0.1 (0.3, 0.4) = (0.084, -0.032), m^ = m / 0.19 = (0.44210526, -0.16842105);
            v = 0.999 (0.00036, 0.00064) + 0.001 (0.09, 0.16) = (0.00044964, 0.00079936), v^ = v / 0.001999;
            r = (0.93217767, -0.26633662); u = r + 0.01 w = (0.95852004, -0.22292756);
            ||w|| = 5.07766348, ||u|| = 0.98410231, trust = 5.15969064; w = (2.13966964, 4.45592978).
    """
    w = nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
    opt = Lamb([w], lr=LR, eps=EPS, weight_decay=WD)
    for grad, expected in (([0.6, -0.8], [2.634236329259016, 4.340906053284598]),
                           ([0.3, 0.4], [2.139669643091069, 4.455929776712265])):
        w.grad = torch.tensor(grad, dtype=torch.float64)
        opt.step()
        torch.testing.assert_close(w.detach(), torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=0)


class Toy(nn.Module):
    """A decayed matrix, a decayed matrix of zeros, a bias and a LayerNorm: LAMB's four cases."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2, 1)
        self.zero = nn.Linear(2, 1, bias=False)
        self.norm = nn.LayerNorm(1)
        with torch.no_grad():
            self.proj.weight.copy_(torch.tensor([[3.0, 4.0]]))
            self.proj.bias.fill_(0.5)
            self.zero.weight.zero_()


def test_zero_norms_and_the_parameters_without_decay():
    model = Toy()
    config = TrainConfig(optimizer="lamb", learning_rate=LR, weight_decay=WD, adam_epsilon=EPS)
    opt = make_optimizer(model, config)
    assert isinstance(opt, Lamb)
    model.proj.weight.grad = torch.tensor([[0.6, -0.8]])
    model.proj.bias.grad = torch.tensor([0.2])
    model.zero.weight.grad = torch.tensor([[1.0, -2.0]])
    model.norm.weight.grad = torch.tensor([0.0])  # a zero update: nothing moves
    model.norm.bias.grad = torch.tensor([-0.5])
    opt.step()
    # Decayed: step 1 of the hand example above.
    torch.testing.assert_close(model.proj.weight, torch.tensor([[2.634236329259016, 4.340906053284598]]))
    # ||w|| = 0: trust 1, so the step is lr x r = 0.1 x g / (|g| + 1e-6) (the decay term 0.01 x 0 vanishes).
    torch.testing.assert_close(model.zero.weight, torch.tensor([[-0.1 / (1 + 1e-6), 0.2 / (2 + 1e-6)]]))
    # Bias and LayerNorm: no decay and no trust ratio, AdamW's first step 0.5 - 0.1 x 0.2 / (0.2 + 1e-6).
    torch.testing.assert_close(model.proj.bias, torch.tensor([0.5 - 0.1 * 0.2 / (0.2 + 1e-6)]))
    assert float(model.norm.weight.detach()) == 1.0  # zero gradient: m = 0, update 0
    torch.testing.assert_close(model.norm.bias, torch.tensor([0.1 * 0.5 / (0.5 + 1e-6)]))


def test_trust_ratio_makes_the_step_relative_to_the_weight():
    """Scaling a tensor scales its LAMB step by the same factor (Adam's step does not depend on ||w||)."""
    steps = []
    for scale in (1.0, 10.0):
        w = nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64) * scale)
        opt = Lamb([w], lr=LR, eps=EPS, weight_decay=0.0)
        w.grad = torch.tensor([0.6, -0.8], dtype=torch.float64)
        before = w.detach().clone()
        opt.step()
        steps.append(w.detach() - before)
    torch.testing.assert_close(steps[1], 10.0 * steps[0])
    assert float(steps[0].norm()) == pytest.approx(LR * 5.0)  # ||step|| = lr x ||w|| with no decay


def test_selection_and_bad_names():
    from bertkit.training.pretrain import resolve_config
    from bertkit.tasks.run import FinetuneConfig, epoch_train_config

    assert resolve_config("albert-large", {}).train.optimizer == "lamb"
    assert resolve_config("tiny", {"optimizer": "lamb"}).train.optimizer == "lamb"
    assert epoch_train_config(FinetuneConfig(optimizer="lamb"), 10).optimizer == "lamb"
    with pytest.raises(ValueError, match="optimizer must be one of adamw, lamb"):
        TrainConfig(optimizer="sgd")
    with pytest.raises(ValueError, match="optimizer must be adamw or lamb"):
        FinetuneConfig(optimizer="adam")


def lamb_start(seed: int = 0) -> nn.Module:
    """The regression model with a weight of norm sqrt(10): LAMB's steps are lr x ||w||, so a weight drawn near 0
    (nn.Linear's init on 4 inputs) would crawl, which is LAMB's design (the step is relative to the layer)."""
    model = linear(seed)
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor([[2.0, -1.0, 1.0, 2.0]]))
    return model


def test_lamb_run_learns_and_resumes_exactly(tmp_path):
    batches = regression_batches([32] * 40)
    c = TrainConfig(optimizer="lamb", max_steps=40, learning_rate=0.05, warmup_steps=0, weight_decay=0.0,
                    max_grad_norm=0.0, log_every=1, save_every=20, device="cpu", precision="fp32", progress=False)
    whole = lamb_start()
    result = train(whole, Regression(), Stream(batches), c, tmp_path / "whole")
    with torch.no_grad():
        first_loss = float((lamb_start()(batches[0]["x"]).squeeze(-1) - batches[0]["y"]).pow(2).mean())
    assert result.last_metrics["loss"] < 0.05 * first_loss
    half = lamb_start()
    assert train(half, Regression(), Stream(batches[:20]), c, tmp_path / "half").step == 20
    second = linear(seed=5)
    train(second, Regression(), Stream(batches), c, tmp_path / "half", resume=True)
    for a, b in zip(whole.parameters(), second.parameters()):
        assert torch.equal(a, b)


# ---- Adafactor -------------------------------------------------------------------------------------------------
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
