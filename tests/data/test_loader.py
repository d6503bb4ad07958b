"""bertkit.data.loader: each rank makes only its own rows, and N ranks together make exactly one rank's batches
with N times the batch; positions resume exactly; worker processes make the same batches."""

from __future__ import annotations

import functools
import itertools
import os
import signal

import numpy as np
import pytest
import torch

from bertkit.data import loader
from bertkit.data.instances import ListDocuments, SpecialIds
from bertkit.data.loader import PretrainingStream, StreamOptions
from bertkit.errors import DataError

SPECIAL = SpecialIds(cls=1, sep=2, pad=0, mask=3)
VOCAB = 120
# Every instance kind of the loader, packed rows with and without document isolation
KINDS = ["nsp", "sop", "sentence-pair", "full-sentences", "full-sentences-isolated", "doc-sentences", "spans", "xlnet"]
EXTRA = {"spans": dict(first_sentinel_id=119, sentinels=15),
         "xlnet": dict(reuse_len=4),
         "full-sentences-isolated": dict(isolate_documents=True), "nsp": dict(dupe_factor=3)}


def corpus(n_docs: int = 23, seed: int = 0) -> ListDocuments:
    rng = np.random.default_rng(seed)
    return ListDocuments([[rng.integers(5, 110, int(rng.integers(2, 12))) for _ in range(int(rng.integers(1, 7)))]
                          for _ in range(n_docs)])


def stream(kind: str, batch: int, rank: int = 0, world: int = 1, docs=None, **kw) -> PretrainingStream:
    options = StreamOptions(instances=kind.removesuffix("-isolated"), **{
        "max_seq_length": 24, "max_predictions_per_seq": 4, "chunk_docs": 5, "lane_tokens": 40,
        **EXTRA.get(kind, {}), **kw.pop("options", {})})
    return PretrainingStream(docs or corpus(), options, SPECIAL, VOCAB, batch, seed=11, rank=rank, world_size=world,
                             prefetch=0, **kw)


def take(s: PretrainingStream, n: int) -> list[dict]:
    return list(itertools.islice(iter(s), n))


def same_rows(a: dict, parts: list[dict]) -> None:
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, torch.cat([p[key] for p in parts])), key


@pytest.mark.parametrize("kind", KINDS)
def test_world_sizes_1_2_and_4_make_the_same_global_batches(kind):
    # 12 batches reach into a second pass over the 23 documents (an epoch boundary inside the lanes).
    one = take(stream(kind, 4), 12)
    for world in (2, 4):
        ranks = [take(stream(kind, 4 // world, r, world), 12) for r in range(world)]
        for j in range(12):
            same_rows(one[j], [ranks[r][j] for r in range(world)])
    assert any((b["labels"] != -100).any() for b in one)


@pytest.mark.parametrize("kind", KINDS)
def test_a_resumed_stream_continues_exactly(kind):
    whole = take(stream(kind, 3), 9)
    first = take(stream(kind, 3), 4)
    resumed = stream(kind, 3)
    resumed.load_state_dict(first[-1]["_state"])
    for a, b in zip(whole[4:], take(resumed, 5)):
        same_rows(a, [b])


def test_each_rank_creates_and_masks_a_quarter_of_the_rows(monkeypatch):
    # Documents of one shape pack into the same number of rows, so each lane chunk makes as many rows: at world
    # size 4 each rank creates (and masks) exactly a quarter of what world size 1 does for the same batches.
    docs = ListDocuments([[np.arange(10, 10 + n) for n in (7, 5, 9)] for _ in range(17)])
    counts = {"masked": 0, "created": 0}
    mask, pack = loader.mask_tokens, loader.packed_rows

    def counting_mask(ids, *args, **kwargs):
        counts["masked"] += ids.shape[0]
        return mask(ids, *args, **kwargs)

    def counting_pack(*args, **kwargs):
        rows = pack(*args, **kwargs)
        counts["created"] += len(rows["input_ids"])
        return rows

    monkeypatch.setattr(loader, "mask_tokens", counting_mask)
    monkeypatch.setattr(loader, "packed_rows", counting_pack)

    def made(batch, rank, world):
        counts.update(masked=0, created=0)
        take(stream("full-sentences", batch, rank, world, docs=docs, options={"isolate_documents": False}), 10)
        return dict(counts)

    whole = made(8, 0, 1)
    assert whole["created"] == whole["masked"] >= 80
    for rank in range(4):
        assert made(2, rank, 4) == {k: v // 4 for k, v in whole.items()}


@pytest.mark.parametrize("kind", ["nsp", "spans", "xlnet"])
def test_each_rank_masks_only_its_rows(monkeypatch, kind):
    # Whatever the documents: what the ranks create and mask adds up to world size 1's, never world size x it.
    # (spans: full-length sequences are corrupted together, `span_corruption_rows`, a shorter one alone)
    seen = {"rows": 0}
    targets = {"nsp": ["mask_tokens"], "spans": ["span_corruption", "span_corruption_rows"],
               "xlnet": ["plm_example"]}[kind]

    def counting(original, *args, **kwargs):
        seen["rows"] += args[0].shape[0] if np.ndim(args[0]) == 2 else 1
        return original(*args, **kwargs)

    for target in targets:
        monkeypatch.setattr(loader, target, functools.partial(counting, getattr(loader, target)))

    def rows(batch, rank, world):
        seen["rows"] = 0
        take(stream(kind, batch, rank, world), 6)
        return seen["rows"]

    whole = rows(8, 0, 1)
    per_rank = [rows(2, r, 4) for r in range(4)]
    assert sum(per_rank) == whole
    if kind != "nsp":  # one corruption or permutation per row of the rank's batches
        assert per_rank == [whole // 4] * 4 == [12] * 4


@pytest.mark.parametrize("kind", ["spans", "xlnet"])
def test_a_rank_reads_only_its_own_rows_tokens(indexed_documents, kind):
    # Whole-corpus chunks read by ranges of the documents laid end to end: the same batches as a source read
    # document by document, and the ranks' reads add up to world size 1's, each a quarter of it (every row of
    # a chunk is as long as the others) -- never the whole chunk on every rank, which grew with the world size.
    docs = corpus(40, seed=3)
    options = {"chunk_docs": 20}  # XLNet: 8 rows of a segment each at least
    plain = take(stream(kind, 8, docs=docs, options=options), 10)

    def reads(batch, rank, world):
        source = indexed_documents([d[0] for d in map(docs.document, range(len(docs)))])
        batches = take(stream(kind, batch, rank, world, docs=source, options=options), 10)
        assert source.whole_reads == 0
        return batches, source.tokens_read

    whole, read = reads(8, 0, 1)
    for a, b in zip(plain, whole):
        same_rows(a, [b])
    ranks = [reads(2, r, 4) for r in range(4)]
    for j in range(10):
        same_rows(whole[j], [ranks[r][0][j] for r in range(4)])
    if kind == "xlnet":  # each row's stream read once per chunk: exactly a quarter each
        assert [n for _, n in ranks] == [read // 4] * 4
    else:  # each sequence read once: the ranks' reads are world size 1's, split
        assert sum(n for _, n in ranks) == read
        assert max(n for _, n in ranks) <= read // 4 + 2 * 24  # sequences of up to 24 tokens, shuffled


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world", [2, 8])
def test_rank_rows_at_world_size_w_are_the_global_batch_rows(kind, world):
    # The stream's contract, rank by rank: rank r's rows at world size W are rows [r·B, (r+1)·B) of world size 1's
    # batch of W·B rows, batch after batch, past an epoch boundary (23 documents; 8 ranks of 2 rows; XLNet cuts the
    # whole corpus into the 16 rows' streams, a chunk of 5 documents being too short for 16 segments).
    options = {"chunk_docs": 23} if kind == "xlnet" else {}
    one = take(stream(kind, 2 * world, options=options), 8)
    for r in range(world):
        mine = take(stream(kind, 2, r, world, options=options), 8)
        for j in range(8):
            for key, value in one[j].items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(value[2 * r:2 * r + 2], mine[j][key]), (r, j, key)


def test_every_pretraining_objective_reads_a_stream_tested_here():
    # ELECTRA and the causal LM train on packed rows, BERT's NSP formats on pairs, ...: each objective's rows are
    # those of a kind whose equality across world sizes, workers and resumes the tests of this file check
    # (ELMo's word windows: tests/data/test_lmstream.py).
    from bertkit.models.registry import OBJECTIVES

    kinds = {row.instances for row in OBJECTIVES.values()}
    assert kinds - {"words"} <= {k.removesuffix("-isolated") for k in KINDS}
    assert set(loader.OBJECTIVE_INSTANCES) <= {k.removesuffix("-isolated") for k in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_worker_processes_make_the_same_batches_and_resume(kind):
    plain = take(stream(kind, 5), 6)
    workers = take(stream(kind, 5, workers=2), 6)
    for a, b in zip(plain, workers):
        same_rows(a, [b])
        assert a["_state"] == b["_state"]
    resumed = stream(kind, 5, workers=3)
    resumed.load_state_dict(plain[2]["_state"])
    for a, b in zip(plain[3:], take(resumed, 3)):
        same_rows(a, [b])


def test_worker_processes_leave_the_global_random_state_alone():
    # The training's dropout draws from torch's global generator: starting the workers must not move it.
    torch.manual_seed(3)
    take(stream("nsp", 4, workers=2), 2)
    after_workers = torch.rand(3)
    torch.manual_seed(3)
    assert torch.equal(after_workers, torch.rand(3))


def test_a_killed_worker_ends_the_stream_with_one_line():
    import multiprocessing

    s = stream("nsp", 4, workers=2, docs=corpus(200))
    s.prefetch = 1
    batches = iter(s)
    next(batches)
    children = multiprocessing.active_children()
    assert children
    with pytest.raises((DataError, RuntimeError)) as caught:
        os.kill(children[0].pid, signal.SIGKILL)
        for _ in range(10_000):
            next(batches)
    if isinstance(caught.value, DataError):  # raised inside the stream (else by torch's SIGCHLD handler)
        assert "worker process" in str(caught.value) and "\n" not in str(caught.value)


def test_the_eval_rows_are_epoch_0_in_document_order_masked_once():
    s = stream("nsp", 4)
    batches = loader.fixed_batches(s, 10, 4)
    assert [len(b["input_ids"]) for b in batches] == [4, 4, 2]
    again = loader.fixed_batches(stream("nsp", 2), 10, 4)  # the training batch size does not matter
    for a, b in zip(batches, again):
        same_rows(a, [b])


@pytest.mark.parametrize("kind", ["nsp", "sop", "sentence-pair", "full-sentences", "full-sentences-isolated",
                                  "doc-sentences"])
def test_lane_chunks_are_the_plain_rules_padded_masked_and_shuffled(kind):
    # The loader lays a lane chunk out at once (pair_rows, packed_rows, one block of fields); built here from the
    # plain functions instead, one instance at a time, as the module docstring states the rule: a document's
    # pairs with [seed, 2, e, d] masked with [seed, 6, e, d]; a chunk's packed rows masked with
    # [seed, 6, e, G, lane, m]; the rows shuffled with [seed, 4, G, lane, m].
    from bertkit.data.instances import (create_nsp_instances, create_sentence_pair_instances, create_sop_instances,
                                        pack_doc_sentences, pack_full_sentences, pad_instances)
    from bertkit.data.masking import mask_tokens

    s = stream(kind, 3, rank=1, world=2)
    o, G, seed = s.options, s.group, s.seed
    replacement = np.setdiff1d(np.arange(VOCAB), [SPECIAL.cls, SPECIAL.sep, SPECIAL.pad, SPECIAL.mask])
    checked = 0
    for lane, m in ((0, 0), (4, 0), (5, 3), (2, 7), (1, 30)):  # m 30: epoch 7, past NSP's dupe_factor 3
        members = s.lane_documents(lane, m)
        units = []
        if kind in ("nsp", "sop", "sentence-pair"):
            for d, e in members:
                e = e % o.dupe_factor if o.dupe_factor else e  # static masking: the dupe_factor fixed copies
                rng = np.random.default_rng([seed, 2, e, d])
                if kind == "nsp":
                    made = create_nsp_instances(s.docs.docs, d, 24, o.short_seq_prob, rng, SPECIAL)
                elif kind == "sop":
                    made = create_sop_instances(s.docs.docs, d, 24, o.short_seq_prob, rng, SPECIAL)
                else:
                    made = create_sentence_pair_instances(s.docs.docs, d, 24, rng, SPECIAL)
                units.append((made, [seed, 6, e, d]))
        else:
            pack = pack_doc_sentences if kind == "doc-sentences" else pack_full_sentences
            subset = ListDocuments([s.docs.docs.document(d)[0] for d, _ in members],
                                   [s.docs.docs.document(d)[1] for d, _ in members])
            units.append((list(pack(subset, 24, special=SPECIAL)), [seed, 6, members[0][1], G, lane, m]))
        fields = []
        for made, words in units:
            if not made:
                continue
            arrays = pad_instances(made, 24, SPECIAL.pad)
            ids, labels = mask_tokens(arrays["input_ids"], arrays["special_mask"], np.random.default_rng(words),
                                      vocab_size=VOCAB, mask_id=SPECIAL.mask, mask_prob=o.mask_prob,
                                      max_predictions=o.max_predictions_per_seq, random_ids=replacement)
            attention = arrays["attention_mask"]
            if kind == "full-sentences-isolated":
                attention = np.where(attention != 0, arrays["segment_ids"] + 1, 0)
            fields.append((ids, labels, attention, arrays["token_type_ids"], arrays.get("next_sentence_label")))
        chunk = s.lane_chunk(lane, m)
        assert chunk["_documents"] == len(members)
        if not fields:
            assert "rows" not in chunk
            continue
        expected = [np.concatenate([f[k] for f in fields]) for k in range(4)]
        perm = np.random.default_rng([seed, 4, G, lane, m]).permutation(len(expected[0]))
        assert chunk["rows"].dtype == np.int64
        for k in range(4):
            assert np.array_equal(chunk["rows"][k], expected[k][perm]), loader.ROW_FIELDS[k]
        if kind in ("nsp", "sop", "sentence-pair"):
            assert np.array_equal(chunk["next_sentence_label"], np.concatenate([f[4] for f in fields])[perm])
        checked += 1
    assert checked >= 3
