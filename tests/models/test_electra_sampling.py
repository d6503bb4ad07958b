"""ELECTRA's generator samples: a correct draw from its softmax, and a function of (seed, step, global row) only,
so a rank's rows get the same replacements whatever the number of ranks."""

import numpy as np
import torch

from bertkit.config import BertConfig
from bertkit.data.masking import row_uniforms
from bertkit.models import IGNORE_INDEX, GeneratorDiscriminator
from bertkit.models.bert import sample_from_logits

TINY = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64, embedding_size=16, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)


def test_inverse_cdf_draws_follow_the_softmax():
    logits = torch.tensor([2.0, 0.5, -1.0, 1.5, -30.0, 0.0])  # one token with probability ~1e-14
    n = 200_000
    u = torch.from_numpy(row_uniforms(0, 0, 0, 0, n, 1)[:, 0])
    tokens = sample_from_logits(logits.expand(n, -1), u)
    freq = torch.bincount(tokens, minlength=6).double() / n
    p = logits.double().softmax(-1)
    # Binomial standard error of each frequency, sqrt(p (1 - p) / n) <= 1.1e-3; 5 of them: a correct sampler
    # fails this with probability < 6 x 5.7e-7 (the numbers are fixed, so the test is deterministic), while one
    # that shifted the intervals by one token would be off by 0.1 or more here
    bound = 5 * torch.sqrt(p * (1 - p) / n)
    assert torch.all((freq - p).abs() <= bound + 1e-12), (freq, p, bound)
    assert freq[4] == 0  # 1e-14 x 2e5 draws: never


def test_inverse_cdf_edges():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0]] * 3 + [[float("-inf"), 0.0, float("-inf"), 0.0]])
    u = torch.tensor([0.0, 0.25, 1 - 2.0 ** -53, 0.5], dtype=torch.float64)
    # u in [k/4, (k+1)/4) takes token k; the last row puts its mass on tokens 1 and 3 only
    assert sample_from_logits(logits, u).tolist() == [0, 1, 3, 3]


def test_row_uniforms_of_a_row_do_not_depend_on_the_split():
    whole = row_uniforms(7, 3, 1, 0, 8, 16)
    assert np.array_equal(np.concatenate([row_uniforms(7, 3, 1, 0, 4, 16), row_uniforms(7, 3, 1, 4, 4, 16)]), whole)
    assert np.array_equal(row_uniforms(7, 3, 1, 2, 2, 16), whole[2:4])
    # every part of the key changes every number
    for other in (row_uniforms(8, 3, 1, 0, 8, 16), row_uniforms(7, 4, 1, 0, 8, 16), row_uniforms(7, 3, 0, 0, 8, 16)):
        assert not np.any(other == whole)
    assert np.unique(whole).size == whole.size


def test_row_uniforms_are_uniform():
    u = row_uniforms(0, 0, 0, 0, 500, 200).ravel()  # 1e5 numbers
    assert 0.0 <= u.min() and u.max() < 1.0
    # mean: standard error sqrt(1/12 / n) = 9.1e-4; decile counts: binomial SE sqrt(n 0.1 0.9) = 95; both x 5
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / u.size)
    counts = np.bincount((u * 10).astype(int), minlength=10)
    assert np.all(np.abs(counts - u.size / 10) < 5 * np.sqrt(u.size * 0.1 * 0.9)), counts
    # neighbouring positions and rows uncorrelated: SE of a correlation 1 / sqrt(n)
    grid = u.reshape(500, 200)
    assert abs(np.corrcoef(grid[:, :-1].ravel(), grid[:, 1:].ravel())[0, 1]) < 5 / np.sqrt(grid[:, 1:].size)
    assert abs(np.corrcoef(grid[:-1].ravel(), grid[1:].ravel())[0, 1]) < 5 / np.sqrt(grid[1:].size)


def _batch(rows: int = 8, width: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 120, (rows, width), generator=g)
    picked = torch.rand(rows, width, generator=g) < 0.3
    labels = torch.where(picked, ids, torch.full_like(ids, IGNORE_INDEX))
    masked = torch.where(picked, torch.full_like(ids, 4), ids)
    return masked, torch.ones_like(ids), torch.zeros_like(ids), labels


def test_a_rank_replaces_its_rows_as_one_process_does():
    """1 process with 8 rows vs 2 ranks with 4 each (rank r passes first row 4r): the same replacements."""
    torch.manual_seed(0)
    model = GeneratorDiscriminator(BertConfig.for_family("electra", **TINY), generator_fraction=0.5).eval()
    ids, mask, types, labels = _batch()
    u = lambda first, rows: torch.from_numpy(row_uniforms(3, 5, 0, first, rows, ids.shape[1]))  # noqa: E731
    with torch.no_grad():
        whole = model(ids, mask, types, labels, uniforms=u(0, 8))
        halves = [model(ids[r * 4:(r + 1) * 4], mask[:4], types[:4], labels[r * 4:(r + 1) * 4], uniforms=u(r * 4, 4))
                  for r in range(2)]
        torch.manual_seed(1)  # the global generator plays no part
        again = model(ids, mask, types, labels, uniforms=u(0, 8))
    assert torch.equal(whole.corrupted_ids, torch.cat([h.corrupted_ids for h in halves]))
    assert torch.equal(whole.corrupted_ids, again.corrupted_ids)
    picked = labels != IGNORE_INDEX
    assert whole.rtd_labels[~picked].sum() == 0 and whole.rtd_labels[picked].sum() > 0  # some tokens replaced
    # another step's numbers replace other tokens (the untrained generator is near uniform over 120 ids)
    with torch.no_grad():
        other = model(ids, mask, types, labels, uniforms=torch.from_numpy(row_uniforms(3, 6, 0, 0, 8, ids.shape[1])))
    assert not torch.equal(other.corrupted_ids, whole.corrupted_ids)
