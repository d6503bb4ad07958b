"""ELMo (bertkit.models.elmo): the properties its features rest on, checked on a tiny random model.

The token layer reads one word's characters only; the forward LSTMs never see a later word, the backward ones
never an earlier word (checked by perturbing words); padding changes nothing; the clipped recurrence is nn.LSTM's
when nothing reaches the clip and bounds the values when something does; the language model's two losses are the
softmax of ElmoModel's own layers; a carried state continues a window exactly; a directory round trip keeps every
feature bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertkit.config import ElmoConfig
from bertkit.models import ElmoLanguageModel, ElmoModel
from bertkit.models.elmo import LSTMLayer, log_uniform_log_prob, log_uniform_samples, reverse_padded

W = 12  # characters per word


def tiny(**fields) -> ElmoConfig:
    return ElmoConfig.preset("tiny", vocab_size=40, char_vocab_size=30, max_characters=W, dropout=0.0, **fields)


def random_chars(B: int, T: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    chars = torch.randint(6, 30, (B, T, W), generator=g)
    lengths = torch.randint(1, W - 1, (B, T), generator=g)
    chars[torch.arange(W)[None, None] >= lengths[..., None]] = 0
    return chars


def model(**fields) -> ElmoModel:
    torch.manual_seed(0)
    return ElmoModel(tiny(**fields)).eval()


def halves(layer: torch.Tensor, P: int) -> tuple[torch.Tensor, torch.Tensor]:
    return layer[..., :P], layer[..., P:]


@pytest.mark.parametrize("clip", [None, 0.5])
def test_directions_see_only_their_side_and_the_token_layer_only_its_word(clip):
    m = model(cell_clip=clip, proj_clip=clip)
    P = m.config.projection_dim
    chars = random_chars(1, 9)
    base = m(chars).hidden_states
    for t in range(9):
        changed = chars.clone()
        changed[0, t] = random_chars(1, 1, seed=100 + t)[0, 0]
        out = m(changed).hidden_states
        # token layer: only position t moves
        moved = (out[0] != base[0]).any(-1)[0]
        assert moved.tolist() == [i == t for i in range(9)]
        for k in (1, 2):
            fwd_new, bwd_new = halves(out[k], P)
            fwd_old, bwd_old = halves(base[k], P)
            fwd_moved = (fwd_new != fwd_old).any(-1)[0].tolist()
            bwd_moved = (bwd_new != bwd_old).any(-1)[0].tolist()
            assert fwd_moved == [i >= t for i in range(9)], f"layer {k}: the forward LSTM saw word {t} early"
            assert bwd_moved == [i <= t for i in range(9)], f"layer {k}: the backward LSTM saw word {t} late"


def test_padding_changes_no_real_position():
    m = model()
    long, short = random_chars(1, 8, seed=1), random_chars(1, 5, seed=2)
    padded = torch.zeros(2, 8, W, dtype=torch.long)
    padded[0], padded[1, :5] = long[0], short[0]
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    together = m(padded, mask).hidden_states
    alone = m(short).hidden_states
    for a, b in zip(together, alone):
        torch.testing.assert_close(a[1, :5], b[0], rtol=1e-5, atol=1e-6)
        assert torch.count_nonzero(a[1, 5:]) == 0  # padding gives zeros
    assert reverse_padded(torch.arange(6).view(2, 3), torch.tensor([3, 2])).tolist() == [[2, 1, 0], [4, 3, 5]]


def test_clipped_loop_is_the_fused_lstm_below_the_clip_and_bounds_above_it():
    config = tiny()
    torch.manual_seed(1)
    layer = LSTMLayer(config.projection_dim, config)
    x = torch.randn(3, 7, config.projection_dim)
    fused, (h, c) = layer(x)
    looped, (h2, c2) = layer.step_loop(x, layer.zero_state(3, x), None, None)
    torch.testing.assert_close(looped, fused, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c2, c, rtol=1e-5, atol=1e-6)
    big = 10 * x
    clipped, (_, cell) = layer.step_loop(big, layer.zero_state(3, x), 0.05, 0.01)
    assert clipped.abs().max() <= 0.01 + 1e-7 and cell.abs().max() <= 0.05 + 1e-7
    assert layer.step_loop(big, layer.zero_state(3, x), None, None)[0].abs().max() > 0.01


def test_language_model_losses_are_the_softmax_of_the_layers():
    torch.manual_seed(0)
    lm = ElmoLanguageModel(tiny()).eval()
    chars, ids = random_chars(2, 7, seed=3), torch.randint(0, 40, (2, 7))
    out = lm(chars, ids)
    P = lm.config.projection_dim
    top = lm.elmo(chars).hidden_states[-1]
    fwd, bwd = halves(top, P)
    # forward: positions 0..5 predict words 1..6; backward over words 1..6: positions 1..6 predict words 0..5
    expect_fwd = F.cross_entropy(lm.softmax(fwd[:, :-1]).reshape(-1, 40), ids[:, 1:].reshape(-1), reduction="sum")
    backward_only = lm.elmo(chars[:, 1:]).hidden_states[-1][..., P:]
    expect_bwd = F.cross_entropy(lm.softmax(backward_only).reshape(-1, 40), ids[:, :-1].reshape(-1),
                                 reduction="sum")
    torch.testing.assert_close(out.forward_loss, expect_fwd, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.backward_loss, expect_bwd, rtol=1e-5, atol=1e-5)
    assert out.forward_count == out.backward_count == 12


def test_a_carried_state_continues_the_text_exactly():
    torch.manual_seed(0)
    lm = ElmoLanguageModel(tiny()).eval()
    chars, ids = random_chars(2, 11, seed=4), torch.randint(0, 40, (2, 11))
    whole = lm(chars, ids)
    first = lm(chars[:, :6], ids[:, :6])  # words 0..5: forward predicts 1..5, state after word 4
    second = lm(chars[:, 5:], ids[:, 5:], state=first.state)  # words 5..10, continuing
    torch.testing.assert_close(first.forward_loss + second.forward_loss, whole.forward_loss, rtol=1e-5, atol=1e-5)
    fresh = lm(chars[:, 5:], ids[:, 5:])
    assert not torch.isclose(fresh.forward_loss, second.forward_loss)


def test_sampled_softmax_trains_and_evaluation_stays_full():
    torch.manual_seed(0)
    lm = ElmoLanguageModel(tiny(sampled_softmax=8))
    chars, ids = random_chars(2, 6, seed=5), torch.randint(0, 40, (2, 6))
    lm.train()
    out = lm(chars, ids)
    assert torch.isfinite(out.forward_loss) and out.forward_loss.requires_grad
    lm.eval()
    full = ElmoLanguageModel(tiny())
    full.load_state_dict(lm.state_dict())
    full.eval()
    assert torch.equal(lm(chars, ids).forward_loss, full(chars, ids).forward_loss)


def test_log_uniform_sampler_matches_its_probabilities():
    V, n = 10, 200_000
    samples = log_uniform_samples(V, n, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(samples, minlength=V).double() / n
    expect = log_uniform_log_prob(torch.arange(V), V).double().exp()
    assert math.isclose(float(expect.sum()), 1.0, rel_tol=1e-6)
    assert (freq - expect).abs().max() < 0.005


def test_directory_round_trip_gives_identical_features(tmp_path):
    torch.manual_seed(0)
    lm = ElmoLanguageModel(tiny(cell_clip=3.0, proj_clip=3.0))
    lm.save_pretrained(tmp_path / "elmo")
    chars = random_chars(2, 5, seed=6)
    again = ElmoModel.from_pretrained(tmp_path / "elmo").eval()
    lm.eval()
    for a, b in zip(lm.elmo(chars).hidden_states, again(chars).hidden_states):
        assert torch.equal(a, b)
    assert torch.equal(ElmoLanguageModel.from_pretrained(tmp_path / "elmo").softmax.weight, lm.softmax.weight)
    assert again.config == lm.config


def test_config_refuses_bad_fields():
    with pytest.raises(ValueError, match="lstm_dim"):
        tiny(lstm_dim=8)
    with pytest.raises(ValueError, match="max_characters"):
        ElmoConfig.preset("tiny", max_characters=2)
    with pytest.raises(ValueError, match="sampled_softmax"):
        ElmoConfig.preset("tiny", vocab_size=10, sampled_softmax=10)
    with pytest.raises(ValueError, match="unknown config keys"):
        ElmoConfig.from_dict({**tiny().to_dict(), "hidden_sizes": 3})


@pytest.mark.parametrize("clip", [None, 0.5])
def test_a_row_carries_the_state_of_its_real_words_only(clip):
    """With lengths, each row's final state is the one after its own last real position (the fused nn.LSTM path
    packs the rows, the clipped path stops updating them): the row run alone, unpadded, ends in the same state; a
    row of length 0 keeps the state it was given."""
    torch.manual_seed(0)
    layer = LSTMLayer(8, tiny(cell_clip=clip, proj_clip=clip)).eval()
    x = torch.randn(3, 6, 8)
    h0, c0 = torch.randn(3, layer.out_dim), torch.randn(3, layer.lstm.hidden_size)
    lengths = torch.tensor([6, 2, 0])
    out, (h, c) = layer(x, (h0, c0), lengths)
    for row in range(2):
        n = int(lengths[row])
        alone, (h_alone, c_alone) = layer(x[row:row + 1, :n], (h0[row:row + 1], c0[row:row + 1]))
        torch.testing.assert_close(out[row:row + 1, :n], alone, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(h[row], h_alone[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(c[row], c_alone[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(h[2], h0[2]) and torch.equal(c[2], c0[2])


@pytest.mark.parametrize("clip", [None, 0.5])
def test_stateful_rows_are_streams_of_their_own(clip):
    """stateful=True: row b of each batch continues row b of the previous one (both directions, every layer), a
    batch narrower than the last leaves the other rows' states alone, a wider one starts its new rows from zeros.
    Each row's outputs equal a one-row stateful model reading that row's stream alone; reset_states starts over."""
    m = model(cell_clip=clip, proj_clip=clip)
    m.stateful = True
    batches = [random_chars(2, 5, seed=1), random_chars(1, 4, seed=2), random_chars(3, 6, seed=3)]
    together = [m(chars).hidden_states for chars in batches]
    streams = {0: [(0, 0), (1, 0), (2, 0)], 1: [(0, 1), (2, 1)], 2: [(2, 2)]}  # row -> (batch, row) read in turn
    for row, stream in streams.items():
        alone = model(cell_clip=clip, proj_clip=clip)
        alone.stateful = True
        for b, r in stream:
            got = alone(batches[b][r:r + 1]).hidden_states
            for a, want in zip(together[b], got):
                torch.testing.assert_close(a[r:r + 1], want, rtol=1e-5, atol=1e-6)
    m.reset_states()
    fresh = model(cell_clip=clip, proj_clip=clip)
    for a, b in zip(m(batches[2]).hidden_states, fresh(batches[2]).hidden_states):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(together[2][-1][0], fresh(batches[2]).hidden_states[-1][0], atol=1e-4)
