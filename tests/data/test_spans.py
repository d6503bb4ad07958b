"""T5's span corruption (bertkit.data.spans): the noise mask's counts and shape exactly as T5's
`random_spans_noise_mask` draws them, sentinels counted down from the end of the vocabulary, inputs and targets that
together hold every token once, in order, and `random_spans_helper`'s lengths."""

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit.data.spans import (noise_counts, noise_span_to_unique_sentinel, nonnoise_span_to_unique_sentinel,
                                random_spans_helper, random_spans_noise_mask, span_corruption,
                                span_corruption_batch)

VOCAB = 100
FIRST_SENTINEL = VOCAB - 1  # <extra_id_0>, as T5's tokenizer numbers it
EOS = 1


def spans(mask: np.ndarray) -> list[tuple[bool, int]]:
    """Runs of the mask: (is_noise, length) in order."""
    return [(bool(value), len(list(run))) for value, run in itertools.groupby(mask)]


def expected_counts(length: int, density: float = 0.15, mean: float = 3.0) -> tuple[int, int]:
    """T5's counts, written out independently: float32 products (TensorFlow), half-to-even rounding."""
    noise = int(np.rint(np.float32(length) * np.float32(density)))
    noise = min(max(noise, 1), length - 1)
    return noise, max(int(np.rint(np.float32(noise) / np.float32(mean))), 1)


def test_noise_mask_counts_and_shape_exactly():
    rng = np.random.default_rng(0)
    for length in range(2, 400):
        mask = random_spans_noise_mask(length, rng)
        noise, num_spans = expected_counts(length)
        assert mask.shape == (length,) and mask.dtype == bool
        assert int(mask.sum()) == noise == noise_counts(length)[0]
        runs = spans(mask)
        # Alternating runs, non-noise first and noise last: as many of each as there are noise spans.
        assert [is_noise for is_noise, _ in runs] == [False, True] * num_spans
        assert all(n > 0 for _, n in runs)
        if 1 <= round(length * 0.15) <= length - 1:  # no clamping: the noise fraction is round(L * density) / L
            assert mask.mean() == pytest.approx(int(np.rint(np.float32(length) * np.float32(0.15))) / length)


def test_noise_counts_use_t5_float32_rounding():
    # float32(190) * float32(0.15) = 28.500002 -> 29 (float64 would give 28.5 -> 28); 30 * 0.15 = 4.5 -> 4 (even).
    assert noise_counts(190) == (29, 10)
    assert noise_counts(30) == (4, 1)
    assert noise_counts(512) == (77, 26)
    assert noise_counts(2) == (1, 1) and noise_counts(5) == (1, 1)  # at least one noise token and one span


def test_short_sequences_as_t5():
    rng = np.random.default_rng(1)
    assert random_spans_noise_mask(0, rng).shape == (0,)
    assert random_spans_noise_mask(1, rng).tolist() == [False]  # masked as 2 tokens, cut back to 1
    assert random_spans_noise_mask(2, rng).tolist() == [False, True]


def test_span_lengths_average_three_and_vary():
    rng = np.random.default_rng(2)
    first_noise, first_keep, all_noise = [], [], []
    for _ in range(3000):
        runs = spans(random_spans_noise_mask(512, rng))
        noise = [n for is_noise, n in runs if is_noise]
        first_noise.append(noise[0])
        first_keep.append(runs[0][1])
        all_noise.extend(noise)
    # 77 noise tokens in 26 spans: a segment's expected length is 77/26 = 2.96, whichever segment one looks at.
    assert np.mean(all_noise) == pytest.approx(77 / 26)
    assert np.mean(first_noise) == pytest.approx(77 / 26, abs=0.12)
    assert np.mean(first_keep) == pytest.approx(435 / 26, abs=0.6)
    assert len(set(first_noise)) > 5 and max(first_noise) >= 8  # lengths are random, not all 3
    # Over many sequence lengths the mean span length is close to the asked-for 3.
    lengths = [np.mean([n for noise, n in spans(random_spans_noise_mask(L, rng)) if noise]) for L in range(20, 600)]
    assert np.mean(lengths) == pytest.approx(3.0, abs=0.05)


def test_segmentation_is_uniform():
    # 5 noise tokens in 2 non-empty spans: (1,4) (2,3) (3,2) (4,1) each with probability 1/4.
    rng = np.random.default_rng(3)
    counts = Counter()
    for _ in range(4000):
        mask = random_spans_noise_mask(33, rng, noise_density=5 / 33, mean_noise_span_length=2.5)
        counts[tuple(n for noise, n in spans(mask) if noise)] += 1
    assert set(counts) == {(1, 4), (2, 3), (3, 2), (4, 1)}
    assert all(abs(c / 4000 - 0.25) < 0.03 for c in counts.values())


def test_sentinels_exact_example():
    tokens = np.array([10, 11, 12, 13, 14, 15, 16, 17])
    mask = np.array([0, 1, 1, 0, 0, 1, 0, 1], dtype=bool)
    assert noise_span_to_unique_sentinel(tokens, mask, 99).tolist() == [10, 99, 13, 14, 98, 16, 97]
    assert nonnoise_span_to_unique_sentinel(tokens, mask, 99).tolist() == [99, 11, 12, 98, 15, 97, 17]


def reassemble(inputs: np.ndarray, targets: np.ndarray) -> list[int]:
    """The original tokens back: every sentinel of the input replaced by what follows it in the target."""
    assert inputs[-1] == EOS and targets[-1] == EOS
    span_of, current = {}, None
    for token in targets[:-1].tolist():
        if token > FIRST_SENTINEL - 50:  # a sentinel (the test tokens stay below 40)
            current = span_of.setdefault(token, [])
        else:
            current.append(token)
    out = []
    for token in inputs[:-1].tolist():
        out.extend(span_of.pop(token) if token in span_of else [token])
    assert not span_of  # every target span was used
    return out


def test_span_corruption_keeps_every_token_once_in_order():
    rng = np.random.default_rng(4)
    for length in (2, 3, 7, 20, 33, 64):
        tokens = np.arange(2, 2 + length) % 38 + 2  # ids 2..39, repeats allowed
        inputs, targets = span_corruption(tokens, rng, FIRST_SENTINEL, EOS)
        noise, num_spans = expected_counts(length)
        assert len(inputs) == length - noise + num_spans + 1
        assert len(targets) == noise + num_spans + 1
        sentinels = [FIRST_SENTINEL - k for k in range(num_spans)]  # <extra_id_0>, <extra_id_1>, ...
        assert [t for t in inputs.tolist() if t > 50] == sentinels
        assert [t for t in targets.tolist() if t > 50] == sentinels
        assert targets[0] == FIRST_SENTINEL  # the target opens with the first sentinel
        assert reassemble(inputs, targets) == tokens.tolist()
        assert inputs.dtype == tokens.dtype


def test_determinism_for_a_seed():
    tokens = np.arange(2, 202)
    a = span_corruption(tokens, np.random.default_rng(7), FIRST_SENTINEL, EOS)
    b = span_corruption(tokens, np.random.default_rng(7), FIRST_SENTINEL, EOS)
    c = span_corruption(tokens, np.random.default_rng(8), FIRST_SENTINEL, EOS)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])


def test_batch_is_rows_in_order():
    tokens = np.random.default_rng(0).integers(2, 40, size=(4, 30))
    inputs, targets = span_corruption_batch(tokens, np.random.default_rng(5), FIRST_SENTINEL, EOS)
    rng = np.random.default_rng(5)
    rows = [span_corruption(row, rng, FIRST_SENTINEL, EOS) for row in tokens]
    assert inputs.shape == (4, 30 - 4 + 1 + 1) and targets.shape == (4, 4 + 1 + 1)
    assert np.array_equal(inputs, np.stack([r[0] for r in rows]))
    assert np.array_equal(targets, np.stack([r[1] for r in rows]))


def test_random_spans_helper():
    assert random_spans_helper(512) == (568, 114)  # T5's span-corruption lengths
    assert random_spans_helper(512, noise_density=0.5) == (766, 512)  # targets trimmed to the input length
    rng = np.random.default_rng(6)
    for inputs_length in (16, 64, 100, 128, 256, 512):
        tokens_length, targets_length = random_spans_helper(inputs_length)
        inputs, targets = span_corruption(np.arange(tokens_length) % 38 + 2, rng, FIRST_SENTINEL, EOS)
        assert len(inputs) <= inputs_length and len(targets) == targets_length
        # The longest that fits: one more token would make the input too long.
        noise, num_spans = noise_counts(tokens_length + 1)
        assert tokens_length + 1 - noise + num_spans + 1 > inputs_length


def test_refuses_impossible_settings():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="noise spans need"):
        random_spans_noise_mask(10, rng, noise_density=0.8, mean_noise_span_length=1.0)
    with pytest.raises(ValueError, match="noise_density"):
        random_spans_noise_mask(10, rng, noise_density=0.0)
    with pytest.raises(ValueError, match="one sequence"):
        span_corruption(np.zeros((2, 3), dtype=np.int64), rng, FIRST_SENTINEL, EOS)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 140), st.integers(1, 6), st.sampled_from([0.15, 0.3, 0.5]), st.integers(0, 2**16))
def test_rows_corrupted_together_equal_each_corrupted_alone(length, rows, density, seed):
    from bertkit.data.spans import span_corruption_rows

    tokens = np.random.default_rng(seed).integers(0, 90, size=(rows, length))
    try:
        alone = [span_corruption(row, np.random.default_rng([seed, i]), 99, 1, density, 3.0)
                 for i, row in enumerate(tokens)]
    except ValueError as err:  # a density too high for the span length: the same error together
        with pytest.raises(ValueError, match=str(err)[:30]):
            span_corruption_rows(tokens, [np.random.default_rng([seed, i]) for i in range(rows)], 99, 1, density, 3.0)
        return
    inputs, targets = span_corruption_rows(tokens, [np.random.default_rng([seed, i]) for i in range(rows)], 99, 1,
                                           density, 3.0)
    assert inputs.dtype == alone[0][0].dtype and targets.dtype == alone[0][1].dtype
    assert np.array_equal(inputs, np.stack([a for a, _ in alone]))
    assert np.array_equal(targets, np.stack([t for _, t in alone]))
