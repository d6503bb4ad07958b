"""Length-bucketed batching: EpochBatches' bucketed epochs (coverage, padding, resume, splits) and length-ordered
inference batches (forward_all)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertkit.cli import main
from bertkit.tasks.run import EpochBatches, FinetuneConfig, forward_all
from bertkit.models import BertForSequenceClassification
from conftest import tiny_config

N = 203  # not a multiple of the batch size: the last, partial batch is kept or dropped by the split rule


def skewed_features(n: int = N, seed: int = 0) -> list[dict]:
    """Features whose lengths are skewed as real sentences are (many short, a long tail); "label" = the index, so a
    batch's labels say which examples it holds."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(3 + rng.geometric(0.08, size=n), 60)
    return [{"input_ids": [2] + [5 + i % 7] * int(t - 2) + [3], "token_type_ids": [0] * int(t), "label": i}
            for i, t in enumerate(lengths)]


def take_epochs(stream: EpochBatches, epochs: int) -> list[dict]:
    it = iter(stream)
    return [next(it) for _ in range(epochs * stream.steps_per_epoch * stream.accumulation)]


def padding_fraction(batches: list[dict]) -> float:
    padded = sum(b["attention_mask"].numel() for b in batches)
    return 1 - sum(int(b["attention_mask"].sum()) for b in batches) / padded


def global_batches(features, epochs: int, accumulation: int, world: int, **kwargs) -> list[list[int]]:
    """Example indices of every optimizer step, gathered over all micro-batches of all ranks."""
    streams = [iter(EpochBatches(features, 0, 16, seed=3, grad_accumulation=accumulation, rank=r, world_size=world,
                                 **kwargs)) for r in range(world)]
    steps = epochs * EpochBatches(features, 0, 16, seed=3).steps_per_epoch
    out = []
    for _ in range(steps):
        labels = [next(s)["labels"].tolist() for s in streams for _ in range(accumulation)]
        out.append(sorted(i for part in labels for i in part))
    return out


def test_every_example_once_per_epoch_and_the_partial_batch_rule():
    features = skewed_features()
    for accumulation, kept in ((1, N), (12, 192)):  # 203 = 12 x 16 + 11: 11 rows split in 1 part, not in 12
        stream = EpochBatches(features, 0, 16, seed=1, grad_accumulation=accumulation, bucket_window=4)
        batches = take_epochs(stream, 2)
        plain = take_epochs(EpochBatches(features, 0, 16, seed=1, grad_accumulation=accumulation), 2)
        per_epoch = len(batches) // 2
        for epoch in (slice(0, per_epoch), slice(per_epoch, None)):
            seen = [i for b in batches[epoch] for i in b["labels"].tolist()]
            assert len(seen) == kept and len(set(seen)) == kept
            # Bucketing regroups an epoch's examples; it never changes which ones (nor which one is dropped).
            assert sorted(seen) == sorted(i for b in plain[epoch] for i in b["labels"].tolist())
        # Dynamic padding: every micro-batch is exactly as wide as its longest row.
        assert all(b["input_ids"].shape[1] == int(b["attention_mask"].sum(1).max()) for b in batches)
        # Each row carries its own tokens (the label names the feature it came from).
        for b in batches[:5]:
            for row, i in enumerate(b["labels"].tolist()):
                n = len(features[i]["input_ids"])
                assert b["input_ids"][row, :n].tolist() == features[i]["input_ids"]
                assert int(b["attention_mask"][row].sum()) == n


def test_bucketed_batches_pad_less_than_shuffled_ones():
    features = skewed_features()
    plain = take_epochs(EpochBatches(features, 0, 16, seed=1), 1)
    bucketed = take_epochs(EpochBatches(features, 0, 16, seed=1, bucket_window=4), 1)
    assert sorted(i for b in plain for i in b["labels"].tolist()) == \
        sorted(i for b in bucketed for i in b["labels"].tolist())  # the same examples, only grouped differently
    assert padding_fraction(bucketed) < padding_fraction(plain)  # here 0.32 against 0.62

    # A window covering the whole epoch is a global sort: the batches' length ranges do not overlap...
    whole = take_epochs(EpochBatches(features, 0, 16, seed=1, bucket_window=1000), 1)
    assert padding_fraction(whole) < min(padding_fraction(bucketed), 0.5 * padding_fraction(plain))  # 0.11
    ranges = sorted((int(b["attention_mask"].sum(1).min()), int(b["attention_mask"].sum(1).max())) for b in whole)
    assert all(ranges[k][1] <= ranges[k + 1][0] for k in range(len(ranges) - 1))
    # ... and they are not visited short to long: the batch order is shuffled.
    widths = [b["input_ids"].shape[1] for b in whole]
    assert widths != sorted(widths) and widths != sorted(widths, reverse=True)


def test_without_a_window_the_order_is_the_seeded_permutation():
    features = skewed_features()
    stream = EpochBatches(features, 0, 16, seed=5)
    for epoch in (0, 1):
        order = np.random.default_rng([5, epoch]).permutation(N)
        expected = [order[i * 16:(i + 1) * 16].tolist() for i in range(stream.steps_per_epoch)]
        assert [b.tolist() for b in stream.epoch_batches(epoch)] == expected


def test_bucketing_is_deterministic_per_seed_and_differs_across_epochs_and_seeds():
    features = skewed_features()

    def labels(seed: int, epochs: int = 2) -> list[list[int]]:
        return [b["labels"].tolist() for b in take_epochs(EpochBatches(features, 0, 16, seed, bucket_window=4), epochs)]

    first = labels(7)
    assert first == labels(7)
    assert first != labels(8)
    steps = len(first) // 2
    assert first[:steps] != first[steps:]  # each epoch is reshuffled


@pytest.mark.parametrize("accumulation", [1, 2, 4])
def test_resume_mid_epoch_gives_the_same_remaining_batches(accumulation):
    features = skewed_features()
    stream = EpochBatches(features, 0, 16, seed=2, grad_accumulation=accumulation, bucket_window=3)
    batches = take_epochs(stream, 2)
    per_epoch = len(batches) // 2
    for cut in (per_epoch // 2 + 1, per_epoch - 1, per_epoch + 2):  # mid-step, end of epoch 0, inside epoch 1
        resumed = EpochBatches(features, 0, 16, seed=2, grad_accumulation=accumulation, bucket_window=3)
        resumed.load_state_dict(batches[cut]["_state"])
        it = iter(resumed)
        for b in batches[cut + 1:]:
            c = next(it)
            assert b["_state"] == c["_state"]
            assert torch.equal(b["input_ids"], c["input_ids"]) and torch.equal(b["labels"], c["labels"])


def test_accumulation_and_processes_split_the_same_global_batches():
    features = skewed_features()
    reference = global_batches(features, 2, 1, 1, bucket_window=4)
    assert len(reference) == 2 * 13
    for accumulation, world in ((2, 1), (1, 2), (2, 2), (4, 1), (1, 4)):
        assert global_batches(features, 2, accumulation, world, bucket_window=4) == reference
    assert global_batches(features, 2, 1, 1) != reference  # bucketing did change the batches


def test_bucket_window_option_and_validation(capsys):
    assert FinetuneConfig().bucket_window == 50  # on by default
    with pytest.raises(ValueError, match="bucket_window"):
        FinetuneConfig(bucket_window=-1)
    with pytest.raises(ValueError, match="bucket_window"):
        EpochBatches(skewed_features(), 0, 16, seed=0, bucket_window=-1)
    with pytest.raises(SystemExit):
        main(["finetune", "classify", "--help"])
    assert "--bucket-window" in capsys.readouterr().out


class _Recording(torch.nn.Module):
    """A model that records the padded width and real lengths of every batch it is given."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.calls = model, []

    def forward(self, input_ids, attention_mask, token_type_ids):
        self.calls.append((input_ids.shape[1], attention_mask.sum(1).tolist()))
        return self.model(input_ids, attention_mask, token_type_ids)


def test_forward_all_batches_by_length_and_returns_input_order():
    features = skewed_features(37)
    torch.manual_seed(0)
    model = _Recording(BertForSequenceClassification(tiny_config(max_position_embeddings=64)).eval())
    logits = forward_all(model, features, pad_id=0, batch_size=8)
    lengths = sorted(len(f["input_ids"]) for f in features)
    # Globally sorted: batch k holds the k-th 8 lengths, padded only to the longest of them.
    assert [width for width, _ in model.calls] == [max(lengths[k:k + 8]) for k in range(0, 37, 8)]
    assert sorted(n for _, rows in model.calls for n in rows) == lengths
    with torch.no_grad():
        for i in (0, 5, 36):
            ids = torch.tensor([features[i]["input_ids"]])
            alone = model.model(ids, torch.ones_like(ids), torch.zeros_like(ids)).logits[0].numpy()
            assert np.allclose(logits[i], alone, atol=1e-5, rtol=0)
