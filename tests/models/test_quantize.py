"""int8 quantisation of an encoder's Linear layers (`quantize_int8`): the layers kept in float, the calibration's
per-channel input maxima, and SmoothQuant's smoothing against activation outliers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import tiny_config
from bertkit.models import BertModel
import bertkit.models.pooling as pooling
from bertkit.models.pooling import Bf16Linear, SentenceEncoder, input_maxima, quantize_int8
from bertkit.sentence import SentenceConfig


def _encoder(seed: int) -> SentenceEncoder:
    """A tiny mean-pooling encoder."""
    torch.manual_seed(seed)
    return SentenceEncoder(BertModel(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
                           SentenceConfig(modes=("mean",), normalize=True)).eval()


def _batches(seed: int, n: int = 4):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, 99, (8, 12), generator=g)
        mask = (torch.arange(12) < torch.randint(3, 13, (8, 1), generator=g)).long()
        out.append((ids * mask, mask, torch.zeros_like(ids)))
    return out


def test_keep_leaves_the_named_layers_in_float():
    model = _encoder(0)
    quantized = quantize_int8(model, keep=("ffn.down",), keep_dtype="fp32")
    kinds = {name: type(m).__name__ for name, m in quantized.named_modules() if name.endswith(("ffn.down", "ffn.up"))}
    assert kinds and all(v == "Linear" if k.endswith("down") else v == "Int8Linear" for k, v in kinds.items())
    assert type(next(m for n, m in quantized.named_modules() if n.endswith("ffn.down"))) is nn.Linear


def test_kept_layers_in_bf16_compute_the_same_product_to_bf16_rounding():
    model = _encoder(0)
    quantized = quantize_int8(model, keep=("ffn.down",), keep_dtype="bf16")
    down = [m for n, m in quantized.named_modules() if n.endswith("ffn.down")]
    assert down and all(type(m) is Bf16Linear and m.weight.dtype == torch.bfloat16 for m in down)
    source = model.encoder.layers[0].ffn.down
    x = torch.randn(16, source.in_features, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, exact = down[0](x), source(x)
    assert got.dtype == torch.float32
    assert float((got - exact).norm() / exact.norm()) < 1e-2  # bf16's 8-bit mantissa: ~4e-3 here
    default = quantize_int8(model, keep=("ffn.down",))  # None: bf16 where the CPU has bf16 matmuls, else fp32
    kept = next(m for n, m in default.named_modules() if n.endswith("ffn.down"))
    assert type(kept) is (Bf16Linear if pooling.bf16_matmuls() else nn.Linear)
    with pytest.raises(ValueError, match="keep_dtype"):
        quantize_int8(model, keep=("ffn.down",), keep_dtype="fp16")


@pytest.mark.parametrize("bits", [7, 8])
def test_weight_bits_bound_the_int8_weights(bits):
    """7 bits: [-64, 63] (no int16 overflow in kernels that add product pairs in int16); 8: the whole int8 range."""
    torch.manual_seed(0)
    layer = quantize_int8(nn.Sequential(nn.Linear(64, 32)), weight_bits=bits)[0]
    q = layer.weight().int_repr()
    assert int(q.min()) >= -(1 << (bits - 1)) and int(q.max()) <= (1 << (bits - 1)) - 1
    assert int(q.int().abs().max()) >= (1 << (bits - 1)) - 1  # each channel's largest weight takes the top level
    with pytest.raises(ValueError, match="weight_bits"):
        quantize_int8(nn.Sequential(nn.Linear(64, 32)), weight_bits=6)


def test_default_weight_bits_follow_the_kernels_accumulation(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32))
    for exact, levels in ((False, (63, 64)), (True, (127, 128))):  # each channel's largest |weight|: the top level
        monkeypatch.setattr(pooling, "_INT32_ACCUMULATION", exact)
        assert int(quantize_int8(model)[0].weight().int_repr().int().abs().max()) in levels


def test_eight_bit_weights_halve_the_weight_rounding_where_the_kernels_allow():
    """Where the int8 kernels add in int32 (VNNI), 8-bit weights are exact to their rounding: the error of a
    product with smoothed activations falls from 7-bit weights' (seeds 0-4: 0.0120-0.0143 -> 0.0083-0.0110, lower
    on every seed)."""
    if not pooling.int32_accumulation():
        pytest.skip("this CPU's int8 kernels add product pairs in int16 (no VNNI): 8-bit weights could overflow")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32))
    held_out = _outlier_inputs(100)
    with torch.no_grad():
        exact = model(held_out)
        errors = {bits: float((quantize_int8(model, calibration=[(_outlier_inputs(0),)], weight_bits=bits)(held_out)
                               - exact).norm() / exact.norm()) for bits in (7, 8)}
    assert errors[8] < errors[7]


def test_input_maxima_are_each_channels_largest_input():
    model = _encoder(0)
    batches = _batches(1)
    seen = []
    hook = model.encoder.layers[1].ffn.up.register_forward_hook(lambda m, i, o: seen.append(i[0].abs()))
    maxima = input_maxima(model, batches)
    hook.remove()
    expected = torch.cat([s.reshape(-1, s.shape[-1]) for s in seen]).amax(0)
    assert torch.equal(maxima["encoder.layers.1.ffn.up"], expected)


def _outlier_inputs(seed: int, rows: int = 256) -> torch.Tensor:
    """(rows, 64) normal inputs whose channel 3 is 50x the others (BERT's LayerNorm outputs carry such channels)."""
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed))
    x[:, 3] *= 50
    return x


@pytest.mark.parametrize("seed", range(5))
def test_smoothing_recovers_what_an_outlier_channel_costs(seed):
    """One Linear (64 -> 32) fed inputs with one channel 50x the others: per-tensor int8 activations leave the
    other channels a few levels; smoothing (calibrated on other rows) evens the channels out. Relative error of the
    output on held-out rows, measured over seeds 0-4: plain 0.039-0.064, smoothed 0.0120-0.0143."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 32))
    held_out = _outlier_inputs(100 + seed)
    with torch.no_grad():
        exact = model(held_out)
        plain = quantize_int8(model)(held_out)
        smoothed = quantize_int8(model, calibration=[(_outlier_inputs(seed),)])(held_out)
    error = lambda y: float((y - exact).norm() / exact.norm())  # noqa: E731
    assert error(plain) > 0.03
    assert error(smoothed) < 0.02


def test_smoothing_moves_the_scale_into_the_weights():
    """The quantised weights hold W x s per input channel and the layer multiplies its input by 1/s: with the
    int8 rounding of the weights alone (float inputs) the product is fp32's to that rounding."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32))
    quantized = quantize_int8(model, calibration=[(_outlier_inputs(0),)])
    layer = quantized[0]
    x = _outlier_inputs(1)
    with torch.no_grad():
        approx = nn.functional.linear(x * layer.smooth, layer.weight().dequantize(), layer.bias())
        exact = model(x)
    assert float((approx - exact).norm() / exact.norm()) < 0.02  # 7-bit weights alone: 0.0103 here
    assert not torch.allclose(layer.smooth, torch.ones(64))
