"""T5's training fast paths (bertkit.models.t5): packed rows (`pack`), fused attention projections and oneDNN's
matmuls, with the output projection at the real labels only, pinned to the plain padded path within 1e-5 (logits,
loss and every gradient), for T5 1.0 and 1.1 configs; what `pack` lays out; the exact tanh GELU of T5 1.1."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit.config import IGNORE_INDEX, T5Config
from bertkit.models import T5ForConditionalGeneration
from bertkit.models.bert import set_fast_paths
from bertkit.models.t5 import pack, tanh_gelu

STYLES = {"1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
          "1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)}
VOCAB = 150


def model(style: str, seed: int = 0) -> T5ForConditionalGeneration:
    torch.manual_seed(seed)
    config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, num_heads=4, d_ff=48, num_layers=2, num_decoder_layers=3,
                      relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
                      **STYLES[style])
    return T5ForConditionalGeneration(config)


def batch(sources: list[int], targets: list[int], seed: int = 0) -> tuple[torch.Tensor, ...]:
    """input_ids, attention_mask (B, max source), labels (B, max target) with those real lengths."""
    g = torch.Generator().manual_seed(seed)
    B, S, T = len(sources), max(sources), max(max(targets), 1)
    mask = (torch.arange(S)[None] < torch.tensor(sources)[:, None]).long()
    ids = torch.randint(3, VOCAB, (B, S), generator=g) * mask
    labels = torch.randint(3, VOCAB, (B, T), generator=g)
    labels = labels.masked_fill(torch.arange(T)[None] >= torch.tensor(targets)[:, None], IGNORE_INDEX)
    return ids, mask, labels


def step(m: T5ForConditionalGeneration, ids, mask, labels) -> tuple[torch.Tensor, torch.Tensor, dict]:
    m.zero_grad(set_to_none=True)
    out = m(ids, mask, labels=labels, at_labels=True)
    assert out.loss is None
    loss = torch.nn.functional.cross_entropy(out.logits, labels[labels != IGNORE_INDEX])
    loss.backward()
    return out.logits.detach(), loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("style", STYLES)
def test_packed_fast_path_is_the_plain_path(style):
    m = model(style)
    ids, mask, labels = batch([40, 7, 19, 33, 5, 12, 40, 26], [3, 11, 1, 9, 12, 2, 6, 0], seed=1)
    labels[3, 2] = IGNORE_INDEX  # an ignored label inside a target: the decoder still reads it
    assert pack(mask, labels).source_segments.shape[0] < len(ids)  # the batch does pack
    fast = step(m, ids, mask, labels)
    set_fast_paths(m, unpad=False, fused_qkv=False, onednn=False)
    plain = step(m, ids, mask, labels)
    full = m(ids, mask, labels=labels)  # the ordinary forward: every position's logits
    assert torch.allclose(plain[0], full.logits[labels != IGNORE_INDEX], atol=1e-6)
    assert torch.allclose(plain[1], full.loss, atol=1e-6)
    assert fast[0].shape == plain[0].shape == ((labels != IGNORE_INDEX).sum(), VOCAB)
    assert torch.allclose(fast[0], plain[0], atol=1e-5)
    assert torch.allclose(fast[1], plain[1], atol=1e-5)
    assert fast[2].keys() == plain[2].keys()
    for name in plain[2]:
        assert torch.allclose(fast[2][name], plain[2][name], atol=1e-5), name


def test_unpackable_batches_run_padded_with_equal_results():
    m = model("1.0")
    ids, mask, labels = batch([9, 14, 6], [4, 2, 5], seed=2)
    left = mask.flip(1)  # left padding: not one run from the row's start
    assert pack(left, labels) is None
    ids_left = ids.flip(1)
    fast = m(ids_left, left, labels=labels, at_labels=True).logits
    set_fast_paths(m, unpad=False)
    assert torch.allclose(fast, m(ids_left, left, labels=labels).logits[labels != IGNORE_INDEX], atol=1e-5)
    empty = mask.clone()
    empty[1] = 0
    assert pack(empty, labels) is None


def test_at_labels_needs_labels_alone():
    m = model("1.0")
    ids, mask, labels = batch([5, 3], [2, 2])
    with pytest.raises(ValueError, match="at_labels"):
        m(ids, mask, at_labels=True)
    with pytest.raises(ValueError, match="at_labels"):
        m(ids, mask, labels=labels, decoder_input_ids=m.shift_right(labels), at_labels=True)


def test_equal_short_targets_share_rows():
    # Class labels: every target 2 tokens, as long as the padded targets; sources of 4 to 10 tokens in rows of 20.
    _, mask, labels = batch([10, 4, 6, 5, 9, 7, 8, 4], [2] * 8)
    packing = pack(mask, labels)
    assert packing.source_segments.shape[0] < 8 and packing.target_segments.shape[1] > 2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(0, 9)), min_size=1, max_size=12))
def test_pack_places_every_token_once_within_the_padded_sizes(lengths):
    sources, targets = [n for n, _ in lengths], [m for _, m in lengths]
    ids, mask, labels = batch(sources, targets)
    packing = pack(mask, labels)
    S, T = mask.shape[1], labels.shape[1]
    R, S2 = packing.source_segments.shape
    T2 = packing.target_segments.shape[1]
    assert packing.target_segments.shape[0] == R <= len(lengths) and S2 <= S
    assert R * (S2 + T2) <= len(lengths) * (S + T)  # never more positions than the padded batch
    for i, (n, m) in enumerate(lengths):
        # Example i's tokens, in order and contiguous, in one row of each packed grid: the same row.
        src_rows, src_cols = (packing.source_segments == i + 1).nonzero(as_tuple=True)
        tgt_rows, tgt_cols = (packing.target_segments == i + 1).nonzero(as_tuple=True)
        assert len(src_cols) == n and len(tgt_cols) == m
        assert set(src_rows.tolist()) == {int(src_rows[0])}
        assert set(tgt_rows.tolist()) <= {int(src_rows[0])}
        assert torch.equal(src_cols, src_cols[0] + torch.arange(n))
        assert torch.equal(packing.gather(ids, True)[src_rows, src_cols], ids[i, :n])
        if m:
            assert torch.equal(tgt_cols, tgt_cols[0] + torch.arange(m))
            assert torch.equal(packing.gather(labels, False)[tgt_rows, tgt_cols], labels[i, :m])
    assert int((packing.source_segments > 0).sum()) == sum(sources)
    assert int((packing.target_segments > 0).sum()) == sum(targets)


def test_tanh_gelu_is_transformers_gelu_new_bit_for_bit():
    activations = pytest.importorskip("transformers.activations")
    x = torch.randn(4096) * 4
    assert torch.equal(tanh_gelu(x), activations.NewGELUActivation()(x))
