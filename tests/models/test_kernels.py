"""The float32 CPU kernel choice (bertkit.models.kernels.linear_choice): oneDNN only where it measured faster than
F.linear on this machine, BERTKIT_LINEAR to decide without measuring, and "auto" layers following the choice with
the plain path's numbers (the forced paths are pinned in test_fastpaths.py)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from bertkit.models import kernels

needs_onednn = pytest.mark.skipif(not kernels._ONEDNN, reason="this torch build has no oneDNN linear kernel")


@pytest.fixture
def fresh_choice(monkeypatch, tmp_path):
    """No choice made in this process, an empty per-machine cache, no BERTKIT_LINEAR; the process's own choice
    is put back afterwards."""
    monkeypatch.setattr(kernels, "_CHOICE", None)
    monkeypatch.setenv("BERTKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BERTKIT_LINEAR", raising=False)


def test_the_faster_kernel_is_chosen_and_a_tie_stays_plain():
    assert kernels.choose_kernel(onednn_s=1.0, plain_s=2.0) == "onednn"
    assert kernels.choose_kernel(onednn_s=2.0, plain_s=1.0) == "plain"
    # within the margin (10%) oneDNN is not measurably faster: never risk being slower than plain PyTorch
    assert kernels.choose_kernel(onednn_s=0.95, plain_s=1.0) == "plain"
    assert kernels.choose_kernel(onednn_s=0.85, plain_s=1.0) == "onednn"


@needs_onednn
@pytest.mark.parametrize("times, kernel", [((0.001, 0.004), "onednn"), ((0.004, 0.001), "plain")])
def test_the_choice_follows_the_measurement_once_per_process(times, kernel, fresh_choice, monkeypatch):
    probes = []
    monkeypatch.setattr(kernels, "_probe_times", lambda: probes.append(1) or times)
    choice = kernels.linear_choice()
    assert choice == {"kernel": kernel, "reason": "measured", "onednn_ms": times[0] * 1e3,
                      "plain_ms": times[1] * 1e3, "threads": torch.get_num_threads()}
    assert kernels.linear_choice() is choice and len(probes) == 1  # cached


@needs_onednn
def test_a_later_process_on_the_same_machine_takes_the_measured_choice(fresh_choice, monkeypatch):
    """The first measurement is kept per machine (CPU, torch, threads): a process that would measure the other way
    (the times were close) takes it instead, so one seed trains one model; other threads measure anew."""
    monkeypatch.setattr(kernels, "_probe_times", lambda: (0.001, 0.004))
    first = kernels.linear_choice()
    assert first["kernel"] == "onednn" and first["reason"] == "measured"
    assert json.loads(kernels.cache_path().read_text())[kernels.machine_key()]["kernel"] == "onednn"
    monkeypatch.setattr(kernels, "_CHOICE", None)  # a new process
    monkeypatch.setattr(kernels, "_probe_times", lambda: pytest.fail("measured again on the same machine"))
    again = kernels.linear_choice()
    assert again["kernel"] == "onednn" and again["reason"].startswith("measured earlier on this machine")
    monkeypatch.setattr(kernels, "_CHOICE", None)
    monkeypatch.setattr(kernels, "_probe_times", lambda: (0.004, 0.001))
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert kernels.linear_choice()["kernel"] == "plain"  # another key: measured
    finally:
        torch.set_num_threads(threads)
    assert len(json.loads(kernels.cache_path().read_text())) == 2


def test_an_unwritable_cache_still_gives_a_choice(fresh_choice, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("BERTKIT_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(kernels, "_probe_times", lambda: (0.004, 0.001))
    assert kernels.linear_choice()["kernel"] == "plain"


@needs_onednn
def test_a_resumed_run_takes_the_kernel_it_recorded(fresh_choice, monkeypatch, tmp_path):
    record = tmp_path / "kernels.json"
    monkeypatch.setattr(kernels, "_probe_times", lambda: (0.001, 0.004))
    assert kernels.pin_choice(record, resume=False)["kernel"] == "onednn"
    assert json.loads(record.read_text()) == {"kernel": "onednn"}
    # a process (on another machine, or with the cache gone) that would choose plain resumes with oneDNN
    monkeypatch.setattr(kernels, "_CHOICE", {"kernel": "plain", "reason": "test"})
    pinned = kernels.pin_choice(record, resume=True)
    assert pinned["kernel"] == "onednn" and kernels.linear_choice() is pinned
    # a fresh run measures (here: the cached choice) and overwrites the record; a rank that is not the main one
    # does not write
    monkeypatch.setattr(kernels, "_CHOICE", {"kernel": "plain", "reason": "test"})
    assert kernels.pin_choice(record, resume=False)["kernel"] == "plain"
    assert json.loads(record.read_text()) == {"kernel": "plain"}
    record.write_text('{"kernel": "onednn"}')
    monkeypatch.setattr(kernels, "_CHOICE", {"kernel": "plain", "reason": "test"})
    kernels.pin_choice(record, resume=False, write=False)
    assert json.loads(record.read_text()) == {"kernel": "onednn"}


@needs_onednn
@pytest.mark.parametrize("value", ["onednn", "plain", "PLAIN"])
def test_the_environment_decides_without_measuring(value, fresh_choice, monkeypatch):
    monkeypatch.setenv("BERTKIT_LINEAR", value)
    monkeypatch.setattr(kernels, "_probe_times", lambda: pytest.fail("measured despite BERTKIT_LINEAR"))
    assert kernels.linear_choice() == {"kernel": value.lower(), "reason": f"BERTKIT_LINEAR={value.lower()}"}


def test_a_bad_environment_value_is_named(fresh_choice, monkeypatch):
    monkeypatch.setenv("BERTKIT_LINEAR", "mkl")
    with pytest.raises(ValueError, match="BERTKIT_LINEAR must be auto, onednn or plain, got 'mkl'"):
        kernels.linear_choice()


@needs_onednn
def test_the_real_measurement_gives_a_choice(fresh_choice):
    choice = kernels.linear_choice()
    assert choice["kernel"] in ("onednn", "plain") and choice["reason"] == "measured"
    assert choice["onednn_ms"] > 0 and choice["plain_ms"] > 0
    assert choice["kernel"] == kernels.choose_kernel(choice["onednn_ms"], choice["plain_ms"])


@needs_onednn
@pytest.mark.parametrize("kernel", ["onednn", "plain"])
def test_auto_layers_follow_the_choice_with_the_plain_numbers(kernel, fresh_choice, monkeypatch):
    monkeypatch.setattr(kernels, "_CHOICE", {"kernel": kernel, "reason": "test"})
    calls = []
    real = kernels._onednn_mm
    monkeypatch.setattr(kernels, "_onednn_mm", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(0)
    layer = kernels.Linear(96, 80)
    assert layer.onednn == "auto"
    x = torch.randn(4, 160, 96, requires_grad=True)  # 4 x 160 x 96 x 80 multiply-adds: above ONEDNN_MIN_MACS
    y = layer(x)
    y.square().sum().backward()
    grads = (x.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone())
    x.grad, layer.weight.grad, layer.bias.grad = None, None, None
    expected = F.linear(x, layer.weight, layer.bias)
    expected.square().sum().backward()
    assert len(calls) == (3 if kernel == "onednn" else 0)  # output, input gradient, weight gradient
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=0)
    for got, want in zip(grads, (x.grad, layer.weight.grad, layer.bias.grad)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
