"""T5's span corruption: which tokens to drop, and the input and target rows that make of a token sequence.

The rules are those of google-research/text-to-text-transfer-transformer (`random_spans_noise_mask`,
`noise_span_to_unique_sentinel`, `nonnoise_span_to_unique_sentinel`, `random_spans_helper`), on numpy arrays:

* the noise mask of a sequence of n tokens: round(n * noise_density) noise tokens, kept within [1, n - 1];
  round(noise tokens / mean_noise_span_length) noise spans, at least 1; the noise tokens and the other tokens are
  each cut at random into that many non-empty segments, which then alternate, a non-noise segment first;
* the input keeps the non-noise tokens and puts one sentinel in place of each noise span; the target lists each
  noise span after its sentinel; both end with EOS. Sentinels count down from the end of the vocabulary, as T5's
  tokenizer numbers them: <extra_id_0> is `first_sentinel_id` (vocab_size - 1), <extra_id_1> the id below, ...;
* `random_spans_helper`: how many tokens to corrupt so that the input comes out at a given length, and the
  target's length then.
* `split_tokens`: the corpus cut into token sequences of that length, documents end to end.

Rounding is half-to-even (numpy's rint), as TensorFlow's `tf.round` does, of float32 products in the mask (T5's
TensorFlow arithmetic) and of float64 ones in the helper (T5's Python arithmetic). Everything is a pure function of its
arguments and the generator's state; the generator is drawn twice per sequence (noise segments, then non-noise
segments).
"""

from __future__ import annotations

import numpy as np

NOISE_DENSITY = 0.15  # fraction of the tokens dropped (T5's span-corruption objective)
MEAN_NOISE_SPAN_LENGTH = 3.0  # mean length of a dropped span


def _round(x: float) -> int:
    """Half-to-even rounding, TensorFlow's tf.round (and Python's round)."""
    return int(np.rint(x))


def noise_counts(length: int, noise_density: float = NOISE_DENSITY,
                 mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH) -> tuple[int, int]:
    """(noise tokens, noise spans) that `random_spans_noise_mask` puts in a sequence of `length` (>= 2) tokens.

    The products are float32, as in T5's TensorFlow code: at a few lengths this rounds otherwise than float64
    would (190 tokens at density 0.15: 28.500002 -> 29 noise tokens, where 28.5 would give 28).
    """
    f32 = np.float32
    num_noise = min(max(_round(f32(length) * f32(noise_density)), 1), length - 1)
    return num_noise, max(_round(f32(num_noise) / f32(mean_noise_span_length)), 1)


def _random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """Cut `num_items` items into `num_segments` non-empty segments, uniformly at random -> (num_segments,) lengths.

    Which of the num_items - 1 gaps start a new segment is a random permutation of num_segments - 1 ones among
    zeros (T5's rule)."""
    starts = np.zeros(num_items - 1, dtype=bool)
    starts[: num_segments - 1] = True
    first_in_segment = np.concatenate([[False], rng.permutation(starts)])  # (num_items,)
    segment = np.cumsum(first_in_segment)
    return np.bincount(segment, minlength=num_segments)


def random_spans_noise_mask(length: int, rng: np.random.Generator, noise_density: float = NOISE_DENSITY,
                            mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH) -> np.ndarray:
    """(length,) bool, True at the tokens to drop: spans of mean length `mean_noise_span_length` covering
    round(length * noise_density) tokens (within [1, length - 1]), the first token never dropped.

    As T5, a length-1 sequence is masked as if it had 2 tokens and the mask cut back (so it keeps its token).
    Raises ValueError when there are fewer non-noise tokens than noise spans (a density too high for the span
    length), where T5's procedure has no answer.
    """
    if not 0.0 < noise_density < 1.0:
        raise ValueError(f"noise_density must be in (0, 1), got {noise_density!r}")
    if mean_noise_span_length <= 0:
        raise ValueError(f"mean_noise_span_length must be positive, got {mean_noise_span_length!r}")
    if length <= 0:
        return np.zeros(0, dtype=bool)
    original, length = length, max(length, 2)
    num_noise, num_spans = noise_counts(length, noise_density, mean_noise_span_length)
    if length - num_noise < num_spans:
        raise ValueError(f"{num_spans} noise spans need as many non-noise tokens, but a sequence of {length} "
                         f"has {length - num_noise} at noise_density {noise_density}; lower the density or "
                         f"lengthen the spans")
    noise_lengths = _random_segmentation(num_noise, num_spans, rng)
    keep_lengths = _random_segmentation(length - num_noise, num_spans, rng)
    # Alternate: keep, noise, keep, noise, ...; each segment's tokens get its parity.
    interleaved = np.stack([keep_lengths, noise_lengths], axis=1).reshape(-1)  # (2 * spans,)
    is_noise = np.repeat(np.tile([False, True], num_spans), interleaved)
    return is_noise[:original]


def noise_span_to_unique_sentinel(tokens: np.ndarray, noise_mask: np.ndarray, first_sentinel_id: int) -> np.ndarray:
    """Replace each span of noise tokens by one sentinel: the k-th span (from 0) by first_sentinel_id - k."""
    tokens, noise_mask = np.asarray(tokens), np.asarray(noise_mask, dtype=bool)
    previous = np.concatenate([[False], noise_mask[:-1]])
    first = noise_mask & ~previous  # the first token of every span
    sentinels = first_sentinel_id + 1 - np.cumsum(first)
    out = np.where(first, sentinels, tokens).astype(tokens.dtype)
    return out[~(noise_mask & previous)]  # the rest of each span goes


def nonnoise_span_to_unique_sentinel(tokens: np.ndarray, noise_mask: np.ndarray,
                                     first_sentinel_id: int) -> np.ndarray:
    """The target side: the noise tokens kept, each span of the other tokens replaced by a sentinel."""
    return noise_span_to_unique_sentinel(tokens, ~np.asarray(noise_mask, dtype=bool), first_sentinel_id)


def span_corruption(tokens: np.ndarray, rng: np.random.Generator, first_sentinel_id: int, eos_token_id: int,
                    noise_density: float = NOISE_DENSITY,
                    mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """One token sequence (n,) -> (input, target), each ending with EOS.

    input:  the tokens with each noise span replaced by its sentinel: a <X> d e <Y> h </s>
    target: each sentinel followed by the span it replaced:         <X> b c <Y> f g </s>
    (The mask alternates starting with kept tokens and ends on a noise span, so the target has no sentinel after
    its last span.) Sentinel ids are first_sentinel_id, first_sentinel_id - 1, ...; the tokens are assumed not to
    contain them (T5's tokenizer never produces them from text).
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"span_corruption takes one sequence (n,), got shape {tokens.shape}")
    mask = random_spans_noise_mask(len(tokens), rng, noise_density, mean_noise_span_length)
    eos = np.array([eos_token_id], dtype=tokens.dtype)
    inputs = noise_span_to_unique_sentinel(tokens, mask, first_sentinel_id)
    targets = nonnoise_span_to_unique_sentinel(tokens, mask, first_sentinel_id)
    return np.concatenate([inputs, eos]), np.concatenate([targets, eos])


def span_corruption_batch(tokens: np.ndarray, rng: np.random.Generator, first_sentinel_id: int, eos_token_id: int,
                          noise_density: float = NOISE_DENSITY,
                          mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """Rows (B, n) -> inputs (B, n_in) and targets (B, n_out), `span_corruption` row by row in order.

    Rows of one length get the same numbers of noise tokens and spans, so every row's input and target have the
    same lengths: no padding is needed (the lengths are those `random_spans_helper` computes).
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"span_corruption_batch takes rows (batch, n), got shape {tokens.shape}")
    pairs = [span_corruption(row, rng, first_sentinel_id, eos_token_id, noise_density, mean_noise_span_length)
             for row in tokens]
    if not pairs:
        return tokens[:, :0], tokens[:, :0]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


def span_corruption_rows(tokens: np.ndarray, rngs: list[np.random.Generator], first_sentinel_id: int,
                         eos_token_id: int, noise_density: float = NOISE_DENSITY,
                         mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """Rows (B, n) -> inputs (B, n_in) and targets (B, n_out): `span_corruption(tokens[i], rngs[i], ...)` for every
    row i, each row drawing from its own generator. Only the draws (two permutations per row, in
    `random_spans_noise_mask`'s order) are made row by row; the segment lengths, the noise masks and the
    sentinel substitution are computed for all rows at once (rows of one length have the same counts).

    n must be at least 2 (a shorter row goes through `span_corruption`)."""
    tokens = np.asarray(tokens)
    b, n = tokens.shape
    if n < 2:
        raise ValueError(f"span_corruption_rows needs rows of at least 2 tokens, got {n}")
    num_noise, num_spans = noise_counts(n, noise_density, mean_noise_span_length)
    if n - num_noise < num_spans:
        random_spans_noise_mask(n, rngs[0] if rngs else np.random.default_rng(), noise_density,
                                mean_noise_span_length)  # raises its error
    noise_gaps = np.zeros(num_noise - 1, dtype=bool)
    noise_gaps[:num_spans - 1] = True
    keep_gaps = np.zeros(n - num_noise - 1, dtype=bool)
    keep_gaps[:num_spans - 1] = True
    # (B, items - 1) each: which gaps start a new segment, as `_random_segmentation` draws them
    noise_first = np.empty((b, num_noise - 1), dtype=bool)
    keep_first = np.empty((b, n - num_noise - 1), dtype=bool)
    for i, rng in enumerate(rngs):
        noise_first[i] = rng.permutation(noise_gaps)
        keep_first[i] = rng.permutation(keep_gaps)

    def lengths(first: np.ndarray) -> np.ndarray:
        """(B, num_spans) segment lengths: `_random_segmentation`'s bincount of each row's segment numbers."""
        segment = np.concatenate([np.zeros((b, 1), dtype=np.int64), np.cumsum(first, axis=1)], axis=1)
        flat = (segment + np.arange(b)[:, None] * num_spans).reshape(-1)
        return np.bincount(flat, minlength=b * num_spans).reshape(b, num_spans)

    interleaved = np.stack([lengths(keep_first), lengths(noise_first)], axis=2).reshape(-1)  # keep, noise, ...
    mask = np.repeat(np.tile([False, True], b * num_spans), interleaved).reshape(b, n)

    def substitute(noise: np.ndarray, width: int) -> np.ndarray:
        """`noise_span_to_unique_sentinel` of every row: (B, width), the rows having as many kept positions."""
        previous = np.zeros_like(noise)
        previous[:, 1:] = noise[:, :-1]
        first = noise & ~previous
        sentinels = first_sentinel_id + 1 - np.cumsum(first, axis=1)
        out = np.where(first, sentinels, tokens).astype(tokens.dtype)
        return out[~(noise & previous)].reshape(b, width)

    eos = np.full((b, 1), eos_token_id, dtype=tokens.dtype)
    inputs = np.concatenate([substitute(mask, n - num_noise + num_spans), eos], axis=1)
    targets = np.concatenate([substitute(~mask, num_noise + num_spans), eos], axis=1)
    return inputs, targets


def random_spans_helper(inputs_length: int, noise_density: float = NOISE_DENSITY,
                        mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH, extra_tokens_per_span_inputs: int = 1,
                        extra_tokens_per_span_targets: int = 1) -> tuple[int, int]:
    """(tokens_length, targets_length): the longest token sequence whose corrupted input (non-noise tokens, one
    sentinel per span, EOS) fits in `inputs_length`, and the length its target (noise tokens, one sentinel per
    span, EOS) then has. T5's helper, its rounding included: inputs_length 512 at density 0.15 and span length 3
    gives (568, 114).

    With noise_density 0.5 a target one longer than the input is trimmed by one token (T5's own adjustment, so
    that both come out at the usually round inputs_length).
    """
    if inputs_length < 2:
        raise ValueError(f"inputs_length must be at least 2 (a token and EOS), got {inputs_length}")

    def lengths(tokens_length: int) -> tuple[int, int]:
        num_noise = _round(tokens_length * noise_density)
        num_spans = _round(num_noise / mean_noise_span_length)
        return (tokens_length - num_noise + num_spans * extra_tokens_per_span_inputs + 1,
                num_noise + num_spans * extra_tokens_per_span_targets + 1)

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    inputs, targets = lengths(tokens_length)
    if noise_density == 0.5 and targets > inputs:
        tokens_length -= 1
        targets -= 1
    return tokens_length, targets


def split_tokens(documents: list[np.ndarray], tokens_length: int) -> list[np.ndarray]:
    """T5's `reduce_concat_tokens` then `split_tokens`: the documents' tokens end to end (no separator, as in T5's
    span-corruption pipeline), cut into segments of `tokens_length` (`random_spans_helper`'s first number); the
    last segment holds what is left (shorter). Empty documents contribute nothing; no tokens give no segment."""
    if tokens_length < 1:
        raise ValueError(f"tokens_length must be at least 1, got {tokens_length}")
    parts = [np.asarray(d, dtype=np.int64).reshape(-1) for d in documents]
    stream = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return [stream[i:i + tokens_length] for i in range(0, len(stream), tokens_length)]
