"""bertkit.data.lmstream: ELMo's word windows; N ranks make exactly one rank's batches with N times the batch,
and a resumed stream continues exactly."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from bertkit.data.instances import ListDocuments
from bertkit.data.lmstream import WordWindowStream


def corpus(n_docs: int = 19, seed: int = 0) -> ListDocuments:
    rng = np.random.default_rng(seed)
    return ListDocuments([[rng.integers(5, 110, int(rng.integers(2, 12))) for _ in range(int(rng.integers(1, 7)))]
                          for _ in range(n_docs)])


def stream(batch: int, rank: int = 0, world: int = 1) -> WordWindowStream:
    return WordWindowStream(corpus(), 1, 2, 6, batch, seed=5, rank=rank, world_size=world)


def take(s: WordWindowStream, n: int) -> list[dict]:
    return list(itertools.islice(iter(s), n))


@pytest.mark.parametrize("world", [2, 4])
def test_world_sizes_make_the_same_global_windows(world):
    # 30 batches run past the first epoch (the lanes of the second are another permutation of the documents).
    one = take(stream(4), 30)
    assert len({b["_state"]["epoch"] for b in one}) == 2
    ranks = [take(stream(4 // world, r, world), 30) for r in range(world)]
    for j in range(30):
        for key in ("input_ids", "attention_mask"):
            assert torch.equal(one[j][key], torch.cat([ranks[r][j][key] for r in range(world)])), (j, key)
        assert all(ranks[r][j]["_state"] == one[j]["_state"] for r in range(world))


def test_a_resumed_stream_continues_exactly():
    whole = take(stream(3), 25)
    resumed = stream(3)
    resumed.load_state_dict(whole[9]["_state"])
    for a, b in zip(whole[10:], take(resumed, 15)):
        assert torch.equal(a["input_ids"], b["input_ids"])


@pytest.mark.parametrize("world", [1, 2, 4])
def test_a_rank_frames_only_its_own_words(indexed_documents, world):
    # Read by index, a rank frames only the sentences its lanes overlap (first and last documents cut inside):
    # the same windows as documents read whole, and per epoch each rank reads its quarter of the words at most
    # plus the two sentences its lanes begin and end in.
    docs = corpus()
    source = indexed_documents([d[0] for d in map(docs.document, range(len(docs)))])
    longest = max(len(s) for d in range(len(docs)) for s in docs.document(d)[0])
    for rank in range(world):
        plain = WordWindowStream(docs, 1, 2, 6, 4 // world, seed=5, rank=rank, world_size=world)
        indexed = WordWindowStream(source, 1, 2, 6, 4 // world, seed=5, rank=rank, world_size=world)
        source.tokens_read = 0
        lanes = indexed.lanes(0)
        assert np.array_equal(lanes, plain.lanes(0)) and source.whole_reads == 0
        words = int(((lanes != 1) & (lanes != 2)).sum())  # the lanes' tokens, <s> and </s> aside
        assert words <= source.tokens_read <= words + 2 * longest
        for a, b in zip(take(plain, 12), take(indexed, 12)):
            assert torch.equal(a["input_ids"], b["input_ids"])
