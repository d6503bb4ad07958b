"""Deterministic, resumable streams of masked pretraining batches.

The global stream of instances is a pure function of (corpus, options, seed): epoch e visits the documents in a
seeded permutation, `chunk_docs` documents at a time; each chunk's instances are created with a generator seeded
by (seed, e, chunk) and shuffled. Masks come from `masking_rng(seed, e, k)` (dynamic masking: fresh every epoch) or
`masking_rng(seed, e, k, dupe_factor)` (static masking: with it the instances and their masks repeat every
`dupe_factor` epochs, the `dupe_factor` fixed copies of BERT's offline data creation).

Global micro-batch j holds instances [j·G, (j+1)·G) with G = micro_batch_size × world_size, masked together with
a generator seeded by its first instance's (epoch, index); rank r takes the r-th slice of it. Every rank computes
the same stream (instance creation and masking are cheap next to a training step) and keeps its own disjoint part,
so a 2-rank run sees exactly the batches of a 1-rank run with twice the batch.
A position is (epoch, chunk, offset in chunk, index in epoch): enough to regenerate the rest after a restart.

T5's span corruption ("spans" instances) reads the same stream: a chunk's documents end to end, cut into token
sequences of `random_spans_helper`'s length (`bertkit.data.spans.split_tokens`), and each sequence corrupted on
its own with `masking_rng(seed, e, k)` of its own (epoch, index): a batch holds inputs (B, S) with their
attention_mask and targets as labels (B, T), padding IGNORE_INDEX.

XLNet's permutation LM ("xlnet" instances) is not shuffled: a chunk's documents end to end are cut into G equal
streams (G = micro_batch_size x world_size), and group j holds segment j of every stream, so each batch row
continues the row of the batch before it (the memory's premise). Each segment is laid out and permuted with
`masking_rng(seed, e, k)` of its own (`bertkit.data.permutation.plm_example`): a batch holds input_ids,
token_type_ids, attention_mask (B, S), perm_mask (B, S, S), target_mapping (B, P, S), labels (B, P) and
`first_segment` (the rows start afresh); a resumed stream hands the memory saved with its position to its first
batch ("mems").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
import threading
from queue import Full, Queue
from typing import Any

import numpy as np
import torch

from bertkit.data.instances import (
    DocumentSource, Instance, SpecialIds, create_nsp_instances, create_sentence_pair_instances, create_sop_instances,
    pack_doc_sentences, pack_full_sentences, pad_instances,
)
from bertkit.config import IGNORE_INDEX
from bertkit.data.masking import mask_tokens, masking_rng
from bertkit.data.spans import noise_counts, random_spans_helper, span_corruption, split_tokens
from bertkit.data.permutation import plm_example, row_segments, split_a_b

OBJECTIVE_INSTANCES = ("nsp", "sop", "sentence-pair", "full-sentences", "doc-sentences", "spans", "xlnet")
_END = object()  # end-of-stream marker of the prefetch queue


@dataclass(frozen=True)
class StreamOptions:
    instances: str = "nsp"  # nsp | sop | sentence-pair | full-sentences | doc-sentences | spans (T5) | xlnet
    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    mask_prob: float = 0.15
    max_predictions_per_seq: int = 20
    whole_word_masking: bool = False
    dupe_factor: int | None = None  # None = dynamic masking; N = static masking with N copies
    chunk_docs: int = 64
    # Packed rows (full-sentences): the attention mask numbers each row's documents 1, 2, ... instead of 1, so the
    # model keeps attention within a document and restarts positions at its first token (no cross-document
    # attention, as if each document had a row of its own, without the padding).
    isolate_documents: bool = False
    # Span corruption ("spans"): max_seq_length is the corrupted input's length (EOS included); the sentinels
    # are first_sentinel_id, first_sentinel_id - 1, ..., `sentinels` of them (T5's <extra_id_0>, <extra_id_1>, ...).
    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0
    first_sentinel_id: int | None = None
    sentinels: int = 0
    # XLNet ("xlnet"): each segment's first reuse_len tokens continue the previous segment of its row, whose memory
    # they see; max_predictions_per_seq tokens are predicted per segment, spans with (partial_k - 1) x their
    # length of context (bertkit.data.permutation).
    reuse_len: int = 0
    partial_k: int = 7

    def __post_init__(self) -> None:
        if self.instances not in OBJECTIVE_INSTANCES:
            raise ValueError(f"unknown instance kind {self.instances!r}; choose one of {OBJECTIVE_INSTANCES}")
        if self.isolate_documents and self.instances != "full-sentences":
            raise ValueError(f"isolate_documents applies to rows that pack several documents (full-sentences), "
                             f"not to {self.instances!r} instances")
        if self.instances == "spans":
            if not 0.0 < self.noise_density < 1.0:
                raise ValueError(f"the span-corruption noise density must be in (0, 1), got {self.noise_density}")
            if not self.mean_noise_span_length > 0:
                raise ValueError(f"mean_noise_span_length must be positive, got {self.mean_noise_span_length}")
            if self.first_sentinel_id is None or self.sentinels < 1:
                raise ValueError("span corruption needs sentinel tokens (first_sentinel_id and sentinels)")
            spans = self.spans_per_sequence
            if spans > self.sentinels or self.first_sentinel_id - (spans - 1) < 0:
                raise ValueError(f"span corruption at max_seq_length {self.max_seq_length} cuts up to {spans} "
                                 f"spans per sequence, but there are only {self.sentinels} sentinel tokens")

        if self.instances == "xlnet" and not 0 <= self.reuse_len <= self.max_seq_length - 5:
            raise ValueError(f"reuse_len {self.reuse_len} does not fit in a segment of max_seq_length "
                             f"{self.max_seq_length}: A, B, two <sep> and <cls> need 5 more tokens")

    @property
    def span_lengths(self) -> tuple[int, int]:
        """(tokens per sequence before corruption, target length): `random_spans_helper` of max_seq_length."""
        return random_spans_helper(self.max_seq_length, self.noise_density, self.mean_noise_span_length)

    @property
    def spans_per_sequence(self) -> int:
        """The most noise spans a sequence gets (each needs a sentinel of its own)."""
        return noise_counts(max(self.span_lengths[0], 2), self.noise_density, self.mean_noise_span_length)[1]


class _Subset:
    """The documents `indices` of `docs`, as a DocumentSource (for packing one chunk at a time)."""

    def __init__(self, docs: DocumentSource, indices: Sequence[int]) -> None:
        self.docs, self.indices = docs, indices

    def __len__(self) -> int:
        return len(self.indices)

    def document(self, i: int):
        return self.docs.document(int(self.indices[i]))


class PretrainingStream:
    """This rank's micro-batches: dicts of (B, T) tensors input_ids, attention_mask, token_type_ids, labels,
    and (B,) next_sentence_label for pair tasks; "_state" holds the position after the batch.

    Iteration starts at the position last given to `load_state_dict` (the beginning by default); the position
    of what has been consumed travels with each batch, so prefetching never confuses a checkpoint."""

    def __init__(self, docs: DocumentSource, options: StreamOptions, special: SpecialIds, vocab_size: int,
                 micro_batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1,
                 random_ids: np.ndarray | None = None, max_epochs: int | None = None, prefetch: int = 4) -> None:
        if len(docs) == 0:
            raise ValueError("the corpus has no documents")
        self.docs, self.options, self.special = docs, options, special
        self.vocab_size, self.micro_batch_size = vocab_size, micro_batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.random_ids = random_ids
        self.max_epochs = max_epochs
        self.prefetch = prefetch  # batches made ahead by a background thread (0: make them on demand)
        self.position = {"epoch": 0, "chunk": 0, "offset": 0, "index": 0}

    # ---- the pure part: instances of one chunk ------------------------------------------------------------------
    def _creation_epoch(self, epoch: int) -> int:
        d = self.options.dupe_factor
        return epoch % d if d else epoch

    def num_chunks(self) -> int:
        return -(-len(self.docs) // self.options.chunk_docs)

    def chunk_instances(self, epoch: int, chunk: int) -> list[Instance]:
        o = self.options
        e = self._creation_epoch(epoch)
        order = np.random.default_rng([self.seed, 3, e]).permutation(len(self.docs))
        members = order[chunk * o.chunk_docs:(chunk + 1) * o.chunk_docs]
        rng = np.random.default_rng([self.seed, 2, e, chunk])
        out: list[Instance] = []
        if o.instances in ("nsp", "sop"):
            create = create_nsp_instances if o.instances == "nsp" else create_sop_instances
            for d in members:
                out.extend(create(self.docs, int(d), o.max_seq_length, o.short_seq_prob, rng, self.special))
        elif o.instances == "sentence-pair":
            for d in members:
                out.extend(create_sentence_pair_instances(self.docs, int(d), o.max_seq_length, rng, self.special))
        elif o.instances == "xlnet":
            return xlnet_rows([self.docs.document(int(d)) for d in members], o.max_seq_length, o.reuse_len,
                              self.micro_batch_size * self.world_size)
        elif o.instances == "spans":
            # The chunk's documents end to end, cut into uncorrupted sequences (corruption happens at collation).
            documents = [np.concatenate([np.asarray(x, dtype=np.int64) for x in self.docs.document(int(d))[0]]
                                        or [np.zeros(0, dtype=np.int64)]) for d in members]
            for ids in split_tokens(documents, o.span_lengths[0]):
                ones = np.ones(len(ids), dtype=bool)
                out.append(Instance(ids, np.zeros_like(ids), ones, ~ones, -1))
        else:
            pack = pack_full_sentences if o.instances == "full-sentences" else pack_doc_sentences
            out.extend(pack(_Subset(self.docs, members), o.max_seq_length, None, special=self.special))
        perm = rng.permutation(len(out))
        return [out[i] for i in perm]

    def mask(self, input_ids: np.ndarray, special_mask: np.ndarray, word_starts: np.ndarray, epoch: int,
             index: int) -> tuple[np.ndarray, np.ndarray]:
        """Mask a (G, T) group whose first instance is instance `index` of `epoch`."""
        o = self.options
        rng = masking_rng(self.seed, epoch, index, o.dupe_factor)
        return mask_tokens(input_ids, special_mask, rng, vocab_size=self.vocab_size, mask_id=self.special.mask,
                           mask_prob=o.mask_prob, max_predictions=o.max_predictions_per_seq,
                           whole_word=o.whole_word_masking, word_starts=word_starts, random_ids=self.random_ids)

    # ---- iteration ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        return dict(self.position)

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            self.position = {k: int(state[k]) for k in ("epoch", "chunk", "offset", "index")}
            # XLNet: the memory the last trained segment left (this rank's only), handed to the next batch
            self.carried_mems = state.get("mems") if state.get("rank", 0) == self.rank else None

    def instances(self) -> Iterator[tuple[Instance, int, int, dict[str, int]]]:
        """(instance, epoch, index in epoch, position after it), from the current position on."""
        pos = dict(self.position)
        cache_key, cache = None, []
        while self.max_epochs is None or pos["epoch"] < self.max_epochs:
            if (pos["epoch"], pos["chunk"]) != cache_key:
                cache_key, cache = (pos["epoch"], pos["chunk"]), self.chunk_instances(pos["epoch"], pos["chunk"])
            if pos["offset"] < len(cache):
                inst, epoch, index = cache[pos["offset"]], pos["epoch"], pos["index"]
                pos["offset"] += 1
                pos["index"] += 1
                yield inst, epoch, index, dict(pos)
                continue
            pos["chunk"] += 1
            pos["offset"] = 0
            if pos["chunk"] >= self.num_chunks():
                pos = {"epoch": pos["epoch"] + 1, "chunk": 0, "offset": 0, "index": 0}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Batches from the current position on, made `prefetch` ahead in a background thread."""
        if self.prefetch <= 0:
            yield from self._batches()
            return
        queue: Queue = Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def offer(item: Any) -> bool:
            """Put `item` in the queue unless the consumer has stopped; False once it has."""
            while not stop.is_set():
                try:
                    queue.put(item, timeout=0.1)
                    return True
                except Full:
                    continue
            return False

        def produce() -> None:
            try:
                for batch in self._batches():
                    if not offer(batch):
                        return
                offer(_END)
            except BaseException as err:  # hand the error to the consumer, which raises it
                offer(err)

        worker = threading.Thread(target=produce, name="bertkit-batches", daemon=True)
        worker.start()
        try:
            while True:
                item = queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:  # closed (or abandoned): stop the worker and wait for it, so no thread outlives the stream
            stop.set()
            worker.join()

    def _batches(self) -> Iterator[dict[str, Any]]:
        group = self.micro_batch_size * self.world_size
        rows = slice(self.rank * self.micro_batch_size, (self.rank + 1) * self.micro_batch_size)
        pending: list[tuple[Instance, int, int]] = []
        carried = getattr(self, "carried_mems", None)
        for inst, epoch, index, after in self.instances():
            pending.append((inst, epoch, index))
            if len(pending) == group:
                batch = self.collate(pending, after, rows)
                if carried is not None:  # a resumed run: the memory of the checkpoint's last segment
                    batch["mems"], carried = carried, None
                yield batch
                pending = []

    def collate(self, items: list[tuple[Instance, int, int]], state: dict[str, int] | None = None,
                rows: slice = slice(None)) -> dict[str, Any]:
        """Pad and mask a group of (instance, epoch, index) as one, then keep `rows` of it as tensors."""
        if self.options.instances == "spans":
            return self._collate_spans(items, state, rows)
        if self.options.instances == "xlnet":
            return self._collate_xlnet(items, state, rows)
        arrays = pad_instances([inst for inst, _, _ in items], None, self.special.pad)
        _, epoch, index = items[0]
        ids, labels = self.mask(arrays["input_ids"], arrays["special_mask"], arrays["word_starts"], epoch, index)
        attention = arrays["attention_mask"]
        if self.options.isolate_documents:  # documents 1, 2, ... within each row; 0 stays padding
            attention = np.where(attention != 0, arrays["segment_ids"] + 1, 0)
        batch: dict[str, Any] = {
            "input_ids": torch.from_numpy(ids[rows]),
            "attention_mask": torch.from_numpy(attention[rows]),
            "token_type_ids": torch.from_numpy(arrays["token_type_ids"][rows]),
            "labels": torch.from_numpy(labels[rows]),
        }
        if "next_sentence_label" in arrays:
            batch["next_sentence_label"] = torch.from_numpy(arrays["next_sentence_label"][rows])
        if state is not None:
            batch["_state"] = dict(state)
        return batch


    def _collate_spans(self, items: list[tuple[Instance, int, int]], state: dict[str, int] | None,
                       rows: slice) -> dict[str, Any]:
        """Span-corrupt each sequence of a group with the generator of its own (epoch, index), pad the inputs
        (pad id) and the targets (IGNORE_INDEX) to the group's longest, then keep `rows` of it as tensors:
        input_ids and attention_mask (B, S), labels (B, T)."""
        o = self.options
        pairs = [span_corruption(inst.input_ids, masking_rng(self.seed, epoch, index, o.dupe_factor),
                                 o.first_sentinel_id, self.special.sep, o.noise_density, o.mean_noise_span_length)
                 for inst, epoch, index in items]
        width, target_width = max(len(p[0]) for p in pairs), max(len(p[1]) for p in pairs)
        ids = np.full((len(pairs), width), self.special.pad, dtype=np.int64)
        attention = np.zeros((len(pairs), width), dtype=np.int64)
        labels = np.full((len(pairs), target_width), IGNORE_INDEX, dtype=np.int64)
        for i, (inputs, targets) in enumerate(pairs):
            ids[i, :len(inputs)], attention[i, :len(inputs)] = inputs, 1
            labels[i, :len(targets)] = targets
        batch: dict[str, Any] = {"input_ids": torch.from_numpy(ids[rows]),
                                 "attention_mask": torch.from_numpy(attention[rows]),
                                 "labels": torch.from_numpy(labels[rows])}
        if state is not None:
            batch["_state"] = dict(state)
        return batch

    def _collate_xlnet(self, items: list, state: dict[str, int] | None, rows: slice) -> dict[str, Any]:
        """Lay out and permute each segment with the generator of its own (epoch, index) (`plm_example`), then keep
        `rows` as tensors: input_ids, token_type_ids, attention_mask (B, S); perm_mask (B, S, S) float;
        target_mapping (B, P, S); labels (B, P); first_segment: whether the rows start afresh (no memory)."""
        o = self.options
        examples = []
        body = o.max_seq_length - 3
        for seg, epoch, index in items:
            rng = masking_rng(self.seed, epoch, index, o.dupe_factor)
            s, R = seg.start, o.reuse_len
            a, b, is_next = split_a_b(seg.tokens, s + R, body - R, rng)
            ws = np.concatenate([seg.word_starts[s:s + R + len(a)], [True], np.ones(len(b), dtype=bool),
                                 [True, True]])
            if is_next:
                ws[R + len(a) + 1:R + len(a) + 1 + len(b)] = seg.word_starts[s + R + len(a):s + body]
            examples.append(plm_example(seg.tokens[s:s + R], a, b, is_next, ws, self.special.sep, self.special.cls,
                                        o.max_predictions_per_seq, rng, o.partial_k))
        stack = lambda name: torch.from_numpy(np.stack([getattr(e, name) for e in examples])[rows])  # noqa: E731
        batch: dict[str, Any] = {"input_ids": stack("input_ids"), "token_type_ids": stack("token_type_ids"),
                                 "perm_mask": stack("perm_mask").float(), "target_mapping": stack("target_mapping"),
                                 "labels": stack("labels"), "first_segment": items[0][0].first}
        batch["attention_mask"] = torch.ones_like(batch["input_ids"])
        if state is not None:
            batch["_state"] = {**state, "rank": self.rank}
        return batch


def xlnet_rows(documents: list, seq_len: int, reuse_len: int, rows: int) -> list["XLNetSegment"]:
    """A chunk's XLNet segments in batch order: the documents end to end cut into `rows` equal streams, each read
    segment after segment (`row_segments`); group j of `rows` segments holds segment j of every stream, so
    consecutive micro-batches continue each other row by row (the memory's premise). Not shuffled."""
    ids = [np.asarray(x, dtype=np.int64) for doc in documents for x in doc[0]]
    starts = [np.asarray(x, dtype=bool) for doc in documents for x in doc[1]]
    if not ids:
        return []
    tokens, word_starts = np.concatenate(ids), np.concatenate(starts)
    width = len(tokens) // rows
    offsets = row_segments(tokens[:width], seq_len, reuse_len)
    out = []
    for j, start in enumerate(offsets):
        for r in range(rows):
            out.append(XLNetSegment(tokens[r * width:(r + 1) * width], word_starts[r * width:(r + 1) * width],
                                    start, j == 0))
    return out


@dataclass(frozen=True)
class XLNetSegment:
    """One segment to lay out: its row's stream of tokens and word starts, where the segment starts, and whether
    it is the row's first (no memory before it)."""

    tokens: np.ndarray
    word_starts: np.ndarray
    start: int
    first: bool


def fixed_batches(stream: PretrainingStream, max_instances: int, batch_size: int) -> list[dict[str, Any]]:
    """The first `max_instances` instances of epoch 0, masked once, in batches: a fixed evaluation set."""
    items: list[tuple[Instance, int, int]] = []
    for inst, epoch, index, _ in stream.instances():
        if epoch > 0 or len(items) >= max_instances:
            break
        items.append((inst, epoch, index))
    return [stream.collate(items[i:i + batch_size]) for i in range(0, len(items), batch_size)]
