"""Deterministic, resumable streams of masked pretraining batches, each rank making only its own rows.

Rows are lanes. With G = micro_batch_size x world_size, global micro-batch j holds row l of lane l (l < G), and
rank r owns lanes [r·B, (r+1)·B): what a rank creates, pads and masks is its own batch, never the global one, and
a run on N ranks trains on exactly the batches of one rank with N times the batch (G is the same). The documents
of every epoch, in a seeded permutation (`[seed, 3, epoch]`), are laid end to end into one endless sequence D
(epoch after epoch), dealt to the lanes round robin: lane l reads D[l], D[l + G], D[l + 2G], ..., whole
documents until it holds `lane_tokens` tokens (a lane chunk, starting at the lane's m-th document), whose rows it
shuffles (`[seed, 4, G, l, m]`) and hands out one per batch.

Pair instances (NSP, SOP, sentence pairs) are made per document with `[seed, 2, e, d]` (e: the document's epoch,
or e mod dupe_factor under static masking, so the dupe_factor fixed copies of BERT's offline data repeat);
packed rows (FULL-SENTENCES, DOC-SENTENCES) pack a lane chunk's documents. A document's instances (a packed
chunk's rows) are masked together, at creation, with a generator of their own (`lane_chunk`), so no row's mask
depends on the rank, the worker or the batch. Rows are padded to max_seq_length (static shapes: every rank's and
worker's rows line up). A position is, per lane of this rank, (the chunk's first document m, offset in it):
each rank checkpoints its own.

With `workers` > 0, worker processes (torch DataLoader) make the batches, each a contiguous share of the rank's
rows, outside the training process; the shares are joined into pinned memory (on a CUDA machine), so the copy to
the device can be non_blocking (`bertkit.data.workers`). A worker that dies ends the run with one line
(`DataError`); `--resume` continues from the last checkpoint exactly.

T5's span corruption ("spans" instances) and XLNet keep whole-corpus chunks, whose creation is cheap (documents
laid end to end): epoch e visits the documents in the seeded permutation, `chunk_docs` at a time, and global
micro-batch j holds instances [j·G, (j+1)·G); a rank corrupts or permutes only its own rows, and reads only their
tokens (`EndToEnd`: the documents' lengths place a row, no chunk is laid out whole) (`max_epochs` stops these
streams; lane streams are endless). For spans: a chunk's documents end to end, cut into token sequences of
`random_spans_helper`'s length (`bertkit.data.spans.split_tokens`), and each sequence corrupted on its own with `masking_rng(seed, e, k)` of its own (epoch, index): a batch holds inputs (B, S) with their
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
import bisect
import itertools
import threading
from queue import Full, Queue
from typing import Any, Callable

import numpy as np
import torch

from bertkit.data.instances import (
    CachedDocuments, DocumentSource, Instance, ListDocuments, SpecialIds, nsp_pairs, packed_rows, pair_rows,
    sentence_pairs, sop_pairs,
)
from bertkit.config import IGNORE_INDEX
from bertkit.data.masking import mask_tokens, masking_rng
from bertkit.data.spans import noise_counts, random_spans_helper, span_corruption, span_corruption_rows
from bertkit.data.permutation import plm_example, row_segments, split_a_b
# The worker-process wire (`unpack_batch`, `unpack_pinned`, `worker_items`, `pack_batch` importable from here too).
from bertkit.data.workers import join_shares, pack_batch, unpack_batch, unpack_pinned, worker_items

# The instance kinds (INSTANCE_KINDS, at the end of this module: how each is made), OBJECTIVE_INSTANCES their
# names, LANE_INSTANCES those made per lane (see above).
ROW_FIELDS = ("input_ids", "labels", "attention_mask", "token_type_ids")  # a lane chunk's (n, T) fields, in order
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
    chunk_docs: int = 64  # spans, xlnet: documents cut together (a whole-corpus chunk)
    # The other kinds: tokens of whole documents (at least one) a lane (a batch row) cuts, packs and shuffles
    # together; packed rows cross document boundaries within them
    lane_tokens: int = 2048
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
        if self.lane_tokens < 1 or self.chunk_docs < 1:
            raise ValueError(f"lane_tokens and chunk_docs must be at least 1, got {self.lane_tokens}, "
                             f"{self.chunk_docs}")
        if self.instances not in OBJECTIVE_INSTANCES:
            raise ValueError(f"unknown instance kind {self.instances!r}; choose one of {OBJECTIVE_INSTANCES}")
        if self.isolate_documents and not INSTANCE_KINDS[self.instances].cross_documents:
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


class PretrainingStream:
    """This rank's micro-batches: dicts of (B, T) tensors input_ids, attention_mask, token_type_ids, labels,
    and (B,) next_sentence_label for pair tasks; "_state" holds the position after the batch.

    Iteration starts at the position last given to `load_state_dict` (the beginning by default); the position
    of what has been consumed travels with each batch, so prefetching never confuses a checkpoint.

    prefetch: batches made ahead (a background thread, or per worker process); workers: processes that make the
    batches (0: this process).
    """

    def __init__(self, docs: DocumentSource, options: StreamOptions, special: SpecialIds, vocab_size: int,
                 micro_batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1,
                 random_ids: np.ndarray | None = None, max_epochs: int | None = None, prefetch: int = 4,
                 workers: int = 0) -> None:
        if len(docs) == 0:
            raise ValueError("the corpus has no documents")
        if workers < 0:
            raise ValueError(f"workers must be 0 (batches made in this process) or more, got {workers}")
        # Lane kinds read documents through a small cache (NSP's random next segments, a lane chunk's neighbours)
        self.docs = CachedDocuments(docs) if INSTANCE_KINDS[options.instances].lanes else docs
        self.options, self.special = options, special
        self.vocab_size, self.micro_batch_size = vocab_size, micro_batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.random_ids = random_ids
        self.max_epochs = max_epochs
        self.prefetch = prefetch  # batches made ahead by a background thread (0: make them on demand)
        self.workers = min(workers, micro_batch_size)  # each worker makes a share of at least one row
        self.lanes = INSTANCE_KINDS[options.instances].lanes
        self.carried_mems = None
        self.position = self._start()
        self._orders: dict[int, np.ndarray] = {}

    @property
    def kind(self) -> InstanceKind:
        """How this stream's instances are made (its row of INSTANCE_KINDS)."""
        return INSTANCE_KINDS[self.options.instances]

    @property
    def group(self) -> int:
        """G: the rows of a global micro-batch (the lanes)."""
        return self.micro_batch_size * self.world_size

    def _start(self) -> dict[str, Any]:
        if self.lanes:
            return {"group": 0, "lanes": [[0, 0] for _ in range(self.micro_batch_size)]}
        return {"epoch": 0, "chunk": 0, "offset": 0, "index": 0}

    def __getstate__(self) -> dict:  # what a worker process receives: no cached permutations
        state = dict(self.__dict__)
        state["_orders"] = {}
        return state

    # ---- the pure part ----------------------------------------------------------------------------------------
    def _creation_epoch(self, epoch: int) -> int:
        d = self.options.dupe_factor
        return epoch % d if d else epoch

    def _order(self, epoch: int) -> np.ndarray:
        """The documents of `epoch` in its seeded order (the same for every dupe_factor-th epoch)."""
        e = self._creation_epoch(epoch)
        if e not in self._orders:
            if len(self._orders) > 4:
                self._orders.clear()
            self._orders[e] = np.random.default_rng([self.seed, 3, e]).permutation(len(self.docs))
        return self._orders[e]

    def lane_documents(self, lane: int, m: int, group: int | None = None) -> list[tuple[int, int]]:
        """(document, epoch) of the lane chunk of `lane` that starts at its m-th document: D[lane + (m + i)·G] for
        i = 0, 1, ... until they hold lane_tokens tokens."""
        G, n_docs = group or self.group, len(self.docs)
        out, tokens = [], 0
        while tokens < self.options.lane_tokens:
            n = lane + (m + len(out)) * G
            d = int(self._order(n // n_docs)[n % n_docs])
            out.append((d, n // n_docs))
            tokens += sum(len(x) for x in self.docs.document(d)[0])
        return out

    def lane_chunk(self, lane: int, m: int, group: int | None = None) -> dict[str, np.ndarray]:
        """The rows of the lane chunk of `lane` that starts at its m-th document, made, masked and padded to
        max_seq_length, in their shuffled order: "rows" (4, n, T) int64, the fields ROW_FIELDS (input_ids masked,
        labels, attention_mask, token_type_ids), "next_sentence_label" (n,) for pair tasks, and "_documents": how
        many documents the chunk read (no "rows" when it makes none).

        A document's pair instances are masked together with `[seed, 6, e, d]`, a packed chunk's rows with
        `[seed, 6, e, G, lane, m]` (e: the epoch, or e mod dupe_factor under static masking): a row's mask depends
        on its own unit only, never on the rank, the worker or the batch it lands in."""
        o = self.options
        G = group or self.group
        members = self.lane_documents(lane, m, G)
        static = o.dupe_factor is not None
        units: list[tuple[int, int, list[int]]] = []  # (first row, end row, masking seed words) per masking unit
        if self.kind.pairs is not None:
            pairs: list[tuple[np.ndarray, np.ndarray, int]] = []
            for d, e in members:
                ce = self._creation_epoch(e)
                made = self.kind.pairs(self.docs, d, o, np.random.default_rng([self.seed, 2, ce, d]))
                if made:
                    units.append((len(pairs), len(pairs) + len(made), [self.seed, 6, ce if static else e, d]))
                    pairs.extend(made)
            arrays = pair_rows(pairs, o.max_seq_length, self.special) if pairs else None
        else:
            e = members[0][1]
            arrays = packed_rows([self.docs.flat(d) for d, _ in members], o.max_seq_length, self.special,
                                 cross_documents=self.kind.cross_documents)
            if arrays is not None:
                n = len(arrays["input_ids"])
                units.append((0, n, [self.seed, 6, self._creation_epoch(e) if static else e, G, lane, m]))
        if arrays is None:
            return {"_documents": len(members)}
        rows = self._masked_rows(arrays, units)
        perm = np.random.default_rng([self.seed, 4, G, lane, m]).permutation(rows.shape[1])
        chunk = {"rows": rows[:, perm], "_documents": len(members)}
        if "next_sentence_label" in arrays:
            chunk["next_sentence_label"] = arrays["next_sentence_label"][perm]
        return chunk

    def _masked_rows(self, arrays: dict[str, np.ndarray], units: list[tuple[int, int, list[int]]]) -> np.ndarray:
        """(len(ROW_FIELDS), n, T) int64: the laid-out rows `arrays` (`pair_rows`, `packed_rows`) with each unit
        of rows lo..hi-1 masked by the generator of its seed words (in the fields' order, ROW_FIELDS)."""
        o = self.options
        rows = np.empty((len(ROW_FIELDS),) + arrays["input_ids"].shape, dtype=np.int64)
        for lo, hi, words in units:
            rows[0, lo:hi], rows[1, lo:hi] = mask_tokens(
                arrays["input_ids"][lo:hi], arrays["special_mask"][lo:hi], np.random.default_rng(words),
                vocab_size=self.vocab_size, mask_id=self.special.mask, mask_prob=o.mask_prob,
                max_predictions=o.max_predictions_per_seq, whole_word=o.whole_word_masking,
                word_starts=arrays["word_starts"][lo:hi], random_ids=self._replacement_ids())
        attention = arrays["attention_mask"]
        if o.isolate_documents:  # documents 1, 2, ... within each row; 0 stays padding
            attention = np.where(attention != 0, arrays["segment_ids"] + 1, 0)
        rows[2], rows[3] = attention, arrays["token_type_ids"]
        return rows

    def _replacement_ids(self) -> np.ndarray:
        """The ids random replacements draw from: `random_ids`, or every id but the special ones."""
        if getattr(self, "_replacements", None) is None:
            if self.random_ids is not None:
                self._replacements = np.asarray(self.random_ids, dtype=np.int64)
            else:
                specials = [x for x in (self.special.cls, self.special.sep, self.special.pad, self.special.mask)
                            if x is not None]
                self._replacements = np.setdiff1d(np.arange(self.vocab_size, dtype=np.int64), specials)
        return self._replacements

    def num_chunks(self) -> int:
        return -(-len(self.docs) // self.options.chunk_docs)

    def chunk_instances(self, epoch: int, chunk: int, rows: range | None = None) -> Sequence[Instance]:
        """Spans and xlnet: the instances of a whole-corpus chunk (see the module docstring), made when indexed.
        rows: the rows of each group this process takes (XLNet reads their streams in one piece)."""
        o = self.options
        e = self._creation_epoch(epoch)
        members = self._order(epoch)[chunk * o.chunk_docs:(chunk + 1) * o.chunk_docs]
        rng = np.random.default_rng([self.seed, 2, e, chunk])
        # The chunk's documents end to end, read by ranges (`EndToEnd`): every rank cuts the whole chunk but uses
        # only its own rows, so it reads only the tokens of those (the documents' lengths place them)
        text = EndToEnd(self.docs, members, self._document_lengths())
        if self.kind.chunk is None:
            raise ValueError(f"{o.instances!r} instances are made per lane (lane_chunk), not per chunk")
        return self.kind.chunk(self, text, rng, rows)

    def _span_sequences(self, text: EndToEnd, rng: np.random.Generator, rows: range | None) -> Sequence[Instance]:
        """Spans: the chunk's documents end to end (`text`) cut into sequences of `span_lengths[0]` tokens."""
        o = self.options
        # Cut into uncorrupted sequences (corruption happens at collation), in a seeded order, each made when asked
        # for (`LazyRows`): a rank's work per batch does not grow with the world size.
        length = o.span_lengths[0]
        count = -(-text.total // length)
        perm = rng.permutation(count)  # the order of split_tokens(documents, length)
        # The per-sequence fields corruption does not read are views of three shared read-only arrays
        zeros, ones, no = np.zeros(length, dtype=np.int64), np.ones(length, dtype=bool), np.zeros(length, dtype=bool)
        for shared in (zeros, ones, no):
            shared.flags.writeable = False

        def sequence(k: int) -> Instance:
            p = int(perm[k])
            ids = text.read(p * length, min((p + 1) * length, text.total))
            n = len(ids)
            return Instance(ids, zeros[:n], ones[:n], no[:n], -1)
        return LazyRows(count, sequence)

    def _check_chunks_make_rows(self) -> None:
        """ValueError in one line when no chunk can make an instance (an endless search for rows otherwise): no
        token at all, or (XLNet) not even the chunk_docs longest documents cut into G streams of a segment each."""
        o = self.options
        lengths = self._document_lengths()
        k = min(o.chunk_docs, len(lengths))
        longest = int(np.partition(lengths, len(lengths) - k)[len(lengths) - k:].sum())  # the k longest
        if o.instances == "xlnet" and longest // self.group < o.max_seq_length - 3:
            raise ValueError(f"chunk_docs {o.chunk_docs}: no chunk of the corpus holds {self.group} rows (micro-batch "
                             f"x world size) of an XLNet segment of max_seq_length {o.max_seq_length} (at most "
                             f"{longest} tokens); raise chunk_docs or lower the batch size")
        if longest == 0:
            raise ValueError(f"the corpus has no tokens to make {o.instances} instances of")

    def _document_lengths(self) -> np.ndarray:
        """(documents,) int64: every document's tokens, read once per stream (from the index where the source
        has one, `ShardedCorpus.document_sizes`)."""
        if getattr(self, "_lengths", None) is None:
            self._lengths = document_lengths(self.docs)
        return self._lengths

    def mask(self, input_ids: np.ndarray, special_mask: np.ndarray, word_starts: np.ndarray, epoch: int,
             index: int) -> tuple[np.ndarray, np.ndarray]:
        """Mask a (G, T) group whose first instance is instance `index` of `epoch` (one generator for the group)."""
        o = self.options
        rng = masking_rng(self.seed, epoch, index, o.dupe_factor)
        return mask_tokens(input_ids, special_mask, rng, vocab_size=self.vocab_size, mask_id=self.special.mask,
                           mask_prob=o.mask_prob, max_predictions=o.max_predictions_per_seq,
                           whole_word=o.whole_word_masking, word_starts=word_starts, random_ids=self.random_ids)

    # ---- positions --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {k: ([list(x) for x in v] if k == "lanes" else v) for k, v in self.position.items()}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        if self.lanes:
            lanes = state.get("lanes")
            if not isinstance(lanes, list) or len(lanes) != self.micro_batch_size:
                raise ValueError(f"the checkpoint's data position is not one of {self.micro_batch_size} lanes "
                                 f"(a run started by an older bertkit, or with another batch size); resume it "
                                 f"with the version and settings it was started with")
            self.position = {"group": int(state["group"]), "lanes": [[int(k), int(o)] for k, o in lanes]}
            return
        self.position = {k: int(state[k]) for k in ("epoch", "chunk", "offset", "index")}
        # XLNet: the memory the last trained segment left (this rank's only), handed to the next batch
        self.carried_mems = state.get("mems") if state.get("rank", 0) == self.rank else None

    # ---- iteration ------------------------------------------------------------------------------------------
    def instances(self) -> Iterator[tuple[Instance, int, int, dict[str, int]]]:
        """Spans and xlnet: (instance, epoch, index in epoch, position after it), from the current position on."""
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
        """Batches from the current position on: from worker processes, or made `prefetch` ahead in a background
        thread, or on demand."""
        if self.workers > 0:
            yield from self._from_workers()
            return
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

    def _batches(self, share: range | None = None) -> Iterator[dict[str, Any]]:
        """This rank's batches, or the rows `share` (indices among the rank's B rows) of each."""
        share = range(self.micro_batch_size) if share is None else share
        if self.lanes:
            yield from self._lane_batches(share)
            return
        base = self.rank * self.micro_batch_size
        carried = self.carried_mems
        for items, after in self._groups(base + share.start, base + share.stop):
            batch = self.collate(items, after)
            if carried is not None:  # a resumed run: the memory of the checkpoint's last segment
                batch["mems"], carried = carried, None
            yield batch

    def _groups(self, lo: int, hi: int) -> Iterator[tuple[list[tuple[Instance, int, int]], dict[str, int]]]:
        """Spans and xlnet: for each global group of G instances (`instances`' order) the (instance, epoch, index)
        of its rows lo..hi-1, and the position after the group. A group is cut from the chunks as slices: only
        the rows of this rank are touched one by one, so its work per batch does not grow with the world size."""
        pos = dict(self.position)
        G = self.group
        self._check_chunks_make_rows()
        cache_key, cache = None, []
        while True:
            segments = []  # (chunk instances, offset, count, epoch, index of the first)
            n = 0
            while n < G:
                if self.max_epochs is not None and pos["epoch"] >= self.max_epochs:
                    return
                if (pos["epoch"], pos["chunk"]) != cache_key:
                    cache_key = (pos["epoch"], pos["chunk"])
                    cache = self.chunk_instances(pos["epoch"], pos["chunk"], range(lo, hi))
                if pos["offset"] < len(cache):
                    take = min(G - n, len(cache) - pos["offset"])
                    segments.append((cache, pos["offset"], take, pos["epoch"], pos["index"]))
                    n += take
                    pos["offset"] += take
                    pos["index"] += take
                    continue
                pos["chunk"] += 1
                pos["offset"] = 0
                if pos["chunk"] >= self.num_chunks():
                    pos = {"epoch": pos["epoch"] + 1, "chunk": 0, "offset": 0, "index": 0}
            items, row = [], 0
            for chunk, offset, count, epoch, index in segments:
                for k in range(max(lo - row, 0), min(hi - row, count)):
                    items.append((chunk[offset + k], epoch, index + k))
                row += count
            yield items, dict(pos)

    def _lane_batches(self, share: range) -> Iterator[dict[str, Any]]:
        lanes = [self.rank * self.micro_batch_size + r for r in share]
        pos = [list(self.position["lanes"][r]) for r in share]
        group = self.position["group"]
        chunks: dict[int, tuple[int, list]] = {}
        while True:
            items = []
            for i, lane in enumerate(lanes):
                k, offset = pos[i]
                skipped = 0
                while True:
                    cached = chunks.get(lane)
                    if cached is None or cached[0] != k:
                        cached = chunks[lane] = (k, self.lane_chunk(lane, k))
                    if "rows" in cached[1] and offset < cached[1]["rows"].shape[1]:
                        break
                    k, offset, skipped = k + cached[1]["_documents"], 0, skipped + 1
                    if skipped > len(self.docs):
                        raise ValueError(f"no document of the corpus makes a {self.options.instances} instance "
                                         f"of max_seq_length {self.options.max_seq_length}")
                items.append((cached[1], offset))
                pos[i] = [k, offset + 1]
            group += 1
            batch = self.collate_rows(items)
            batch["_state"] = {"group": group, "lanes": [list(p) for p in pos]}
            yield batch

    @staticmethod
    def collate_rows(items: list[tuple[dict[str, np.ndarray], int]]) -> dict[str, Any]:
        """Rows (lane chunk, row) as a batch: one (fields, B, T) block, each row copied into it once, whose
        fields (ROW_FIELDS, then next_sentence_label for pair tasks) are (B, T) tensors viewing it."""
        first = items[0][0]["rows"]
        block = np.empty((first.shape[0], len(items), first.shape[2]), dtype=first.dtype)
        for i, (chunk, r) in enumerate(items):
            block[:, i] = chunk["rows"][:, r]
        batch: dict[str, Any] = {name: torch.from_numpy(block[f]) for f, name in enumerate(ROW_FIELDS)}
        if "next_sentence_label" in items[0][0]:
            batch["next_sentence_label"] = torch.tensor([chunk["next_sentence_label"][r] for chunk, r in items],
                                                        dtype=torch.int64)
        return batch

    def first_rows(self, max_instances: int) -> list[tuple[dict[str, np.ndarray], int]]:
        """Lane kinds: the first `max_instances` rows of epoch 0 read as one lane (documents in the epoch's order)."""
        out: list[tuple[dict[str, np.ndarray], int]] = []
        k = 0
        while len(out) < max_instances and self.lane_documents(0, k, group=1)[0][1] == 0:
            chunk = self.lane_chunk(0, k, group=1)
            out.extend((chunk, r) for r in range(chunk["rows"].shape[1] if "rows" in chunk else 0))
            k += chunk["_documents"]
        return out[:max_instances]

    # ---- worker processes -------------------------------------------------------------------------------------
    def _from_workers(self) -> Iterator[dict[str, Any]]:
        """Batches made by `workers` processes, each a contiguous share of the rows, joined in pinned memory."""
        n = self.workers
        pin = torch.cuda.is_available()
        items = worker_items(_WorkerShares(self, n), n, self.prefetch, self.seed, self.rank)
        carried = self.carried_mems
        try:
            while True:
                parts = list(itertools.islice(items, n))
                if len(parts) < n:
                    return
                if pin and n == 1:  # one copy of the flat tensor into pinned memory; the fields are views of it
                    batch = unpack_pinned(parts[0])
                else:
                    batch = join_shares([unpack_batch(p) for p in parts], self.lanes, pin)
                if carried is not None:
                    batch["mems"], carried = carried, None
                yield batch
        finally:
            items.close()  # the workers end now, not when the generator is collected

    def collate(self, items: list[tuple[Instance, int, int]], state: dict[str, int] | None = None,
                rows: slice = slice(None)) -> dict[str, Any]:
        """Spans and xlnet: corrupt or permute the `rows` of a group of (instance, epoch, index), as tensors."""
        if self.kind.collate is None:
            raise ValueError(f"{self.options.instances!r} rows are collated by collate_rows")
        return self.kind.collate(self, items, state, rows)

    def _collate_spans(self, items: list[tuple[Instance, int, int]], state: dict[str, int] | None,
                       rows: slice) -> dict[str, Any]:
        """Span-corrupt each sequence of `rows` of a group with the generator of its own (epoch, index), pad the
        inputs (pad id) to max_seq_length and the targets (IGNORE_INDEX) to T5's target length (or the longest,
        should a row be longer), as tensors: input_ids and attention_mask (B, S), labels (B, T)."""
        o = self.options
        chosen = items[rows]
        pairs: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(chosen)
        # Rows of the full sequence length are corrupted together (`span_corruption_rows`), the others one by one
        length = o.span_lengths[0]
        full = [i for i, (inst, _, _) in enumerate(chosen) if len(inst.input_ids) == length] if length >= 2 else []
        if full:
            inputs, targets = span_corruption_rows(
                np.stack([chosen[i][0].input_ids for i in full]),
                [masking_rng(self.seed, chosen[i][1], chosen[i][2], o.dupe_factor) for i in full],
                o.first_sentinel_id, self.special.sep, o.noise_density, o.mean_noise_span_length)
            for k, i in enumerate(full):
                pairs[i] = (inputs[k], targets[k])
        for i, (inst, epoch, index) in enumerate(chosen):
            if pairs[i] is None:
                pairs[i] = span_corruption(inst.input_ids, masking_rng(self.seed, epoch, index, o.dupe_factor),
                                           o.first_sentinel_id, self.special.sep, o.noise_density,
                                           o.mean_noise_span_length)
        width = max([o.max_seq_length] + [len(p[0]) for p in pairs])
        target_width = max([o.span_lengths[1]] + [len(p[1]) for p in pairs])
        ids = np.full((len(pairs), width), self.special.pad, dtype=np.int64)
        attention = np.zeros((len(pairs), width), dtype=np.int64)
        labels = np.full((len(pairs), target_width), IGNORE_INDEX, dtype=np.int64)
        for i, (inputs, targets) in enumerate(pairs):
            ids[i, :len(inputs)], attention[i, :len(inputs)] = inputs, 1
            labels[i, :len(targets)] = targets
        batch: dict[str, Any] = {"input_ids": torch.from_numpy(ids),
                                 "attention_mask": torch.from_numpy(attention),
                                 "labels": torch.from_numpy(labels)}
        if state is not None:
            batch["_state"] = dict(state)
        return batch

    def _collate_xlnet(self, items: list, state: dict[str, int] | None, rows: slice) -> dict[str, Any]:
        """Lay out and permute each segment of `rows` with the generator of its own (epoch, index) (`plm_example`),
        as tensors: input_ids, token_type_ids, attention_mask (B, S); perm_mask (B, S, S) float; target_mapping
        (B, P, S); labels (B, P); first_segment: whether the rows start afresh (no memory)."""
        o = self.options
        examples = []
        body = o.max_seq_length - 3
        for seg, epoch, index in items[rows]:
            rng = masking_rng(self.seed, epoch, index, o.dupe_factor)
            s, R = seg.start, o.reuse_len
            a, b, is_next = split_a_b(seg.tokens, s + R, body - R, rng)
            ws = np.concatenate([seg.word_starts[s:s + R + len(a)], [True], np.ones(len(b), dtype=bool),
                                 [True, True]])
            if is_next:
                ws[R + len(a) + 1:R + len(a) + 1 + len(b)] = seg.word_starts[s + R + len(a):s + body]
            examples.append(plm_example(seg.tokens[s:s + R], a, b, is_next, ws, self.special.sep, self.special.cls,
                                        o.max_predictions_per_seq, rng, o.partial_k))
        stack = lambda name: torch.from_numpy(np.stack([getattr(e, name) for e in examples]))  # noqa: E731
        # perm_mask as float32 in one pass (each row's bools converted as they are copied in), not stacked and then
        # converted: (B, S, S) is most of the batch's bytes
        perm_mask = np.empty((len(examples),) + examples[0].perm_mask.shape, dtype=np.float32)
        for i, e in enumerate(examples):
            perm_mask[i] = e.perm_mask
        batch: dict[str, Any] = {"input_ids": stack("input_ids"), "token_type_ids": stack("token_type_ids"),
                                 "perm_mask": torch.from_numpy(perm_mask), "target_mapping": stack("target_mapping"),
                                 "labels": stack("labels"), "first_segment": items[0][0].first}
        batch["attention_mask"] = torch.ones_like(batch["input_ids"])
        if state is not None:
            batch["_state"] = {**state, "rank": self.rank}
        return batch


class _WorkerShares(torch.utils.data.IterableDataset):
    """The DataLoader's view of a stream: worker w yields, for every batch, the rows of its share (contiguous,
    np.array_split of the rank's rows into `workers`); the DataLoader hands the workers' items out round robin,
    so `workers` consecutive items are the shares of one batch, in row order."""

    def __init__(self, stream: PretrainingStream, workers: int) -> None:
        self.stream, self.workers = stream, workers

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        w = 0 if info is None else info.id
        share = np.array_split(np.arange(self.stream.micro_batch_size), self.workers)[w]
        for batch in self.stream._batches(range(int(share[0]), int(share[-1]) + 1)):
            yield pack_batch(batch)


class LazyRows(Sequence):
    """A chunk's rows made when indexed: `make(k)` is row k of `count` (an int index gives a row, a slice a
    list). Every rank cuts a whole-corpus chunk but reads only its own rows of each group, so making all of them
    would cost a rank in proportion to the global batch."""

    def __init__(self, count: int, make) -> None:
        self.count, self.make = count, make

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self.make(i) for i in range(*k.indices(self.count))]
        if k < 0:
            k += self.count
        if not 0 <= k < self.count:
            raise IndexError(f"row {k} of {self.count}")
        return self.make(k)


def document_lengths(docs: DocumentSource) -> np.ndarray:
    """(documents,) int64: each document's tokens (empty sentences add nothing); from the index alone where the
    source can (`ShardedCorpus.document_sizes`), else by reading every document once."""
    if hasattr(docs, "document_sizes"):
        return np.asarray(docs.document_sizes()[0], dtype=np.int64)
    return np.array([sum(len(x) for x in docs.document(d)[0]) for d in range(len(docs))], dtype=np.int64)


class EndToEnd:
    """Documents `members` laid end to end, read by ranges of that stream: only the documents a range overlaps
    are read, and of those only the tokens in it (slices of `ShardedCorpus.token_view`, or `token_range` with the
    word starts), so a rank that uses 1/W of a whole-corpus chunk reads 1/W of it. Before, every rank concatenated
    the whole chunk: its work per batch grew with the world size (the global group spans W times the chunk's
    tokens).

    lengths: (documents,) every document's tokens (`document_lengths`)."""

    def __init__(self, docs: DocumentSource, members: Sequence[int], lengths: np.ndarray) -> None:
        self.docs = docs
        self.members = np.asarray(members, dtype=np.int64)
        ends = np.cumsum(lengths[self.members]) if len(self.members) else np.zeros(0, dtype=np.int64)
        self.total = int(ends[-1]) if len(ends) else 0
        self._ends = ends.tolist()  # bisect on a list: a row's lookup costs less than numpy's call
        # ids per document: views of the stored tokens, placed at once where the source can (`token_views`),
        # else fetched when first read
        self._indexed = hasattr(docs, "token_view")
        self._views: list[np.ndarray | None] = (docs.token_views(self.members) if hasattr(docs, "token_views")
                                                else [None] * len(self.members))
        self._whole: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # other sources: documents read whole

    def read(self, lo: int, hi: int, word_starts: bool = False):
        """Tokens lo..hi-1 of the stream as int64 (and their word starts as bool, when asked): the documents'
        `flat_document` ids end to end, sliced."""
        ids, starts = [], []
        k = bisect.bisect_right(self._ends, lo)  # the document holding token lo
        while lo < hi:
            first, end = (self._ends[k - 1] if k else 0), self._ends[k]
            a, b = lo - first, min(hi, end) - first
            if word_starts:
                piece = self._piece(int(self.members[k]), a, b)
                ids.append(piece[0])
                starts.append(piece[1])
            else:
                ids.append(self._ids(k)[a:b])
            lo, k = first + b, k + 1
        if not ids:
            out = np.zeros(0, dtype=np.int64)
            return (out, np.zeros(0, dtype=bool)) if word_starts else out
        one = ids[0].astype(np.int64) if len(ids) == 1 else np.concatenate(ids).astype(np.int64, copy=False)
        if not word_starts:
            return one
        return one, starts[0] if len(starts) == 1 else np.concatenate(starts)

    def _ids(self, k: int) -> np.ndarray:
        """The ids of the chunk's k-th document: a view of the stored tokens where the source has one."""
        view = self._views[k]
        if view is None:
            d = int(self.members[k])
            view = self._views[k] = self.docs.token_view(d) if self._indexed else self._document(d)[0]
        return view

    def _piece(self, d: int, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        if hasattr(self.docs, "token_range"):
            return self.docs.token_range(d, a, b)
        ids, bits = self._document(d)
        return ids[a:b], bits[a:b]

    def _document(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        """A source without an index: document d read whole (ids int64, word starts), kept for the chunk."""
        whole = self._whole.get(d)
        if whole is None:
            sentences = self.docs.document(d)
            ids = [np.asarray(x, dtype=np.int64) for x in sentences[0]]
            bits = [np.asarray(x, dtype=bool) for x in sentences[1]]
            whole = self._whole[d] = (np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64),
                                      np.concatenate(bits) if bits else np.zeros(0, dtype=bool))
        return whole


def xlnet_rows(documents: list, seq_len: int, reuse_len: int, rows: int) -> Sequence["XLNetSegment"]:
    """A chunk's XLNet segments in batch order: the documents end to end cut into `rows` equal streams, each read
    segment after segment (`row_segments`); group j of `rows` segments holds segment j of every stream, so
    consecutive micro-batches continue each other row by row (the memory's premise). Not shuffled; made when
    indexed (`LazyRows`)."""
    docs = ListDocuments([doc[0] for doc in documents], [doc[1] for doc in documents])
    return _xlnet_rows(EndToEnd(docs, range(len(docs)), document_lengths(docs)), seq_len, reuse_len, rows)


def _xlnet_rows(text: EndToEnd, seq_len: int, reuse_len: int, rows: int,
                mine: range | None = None) -> Sequence["XLNetSegment"]:
    """`xlnet_rows` of documents end to end (`EndToEnd`): a row's stream is read the first time one of its
    segments is asked for (a rank reads only its own rows' tokens), the streams of the rows `mine` (this
    process's, adjacent) in one piece: at a large world size a row is a segment or two long, and a read per row
    cost a rank more per token than a few long rows do."""
    if text.total == 0:
        return []
    width = text.total // rows
    offsets = row_segments(np.zeros(width, dtype=np.int64), seq_len, reuse_len)
    streams: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def segment(k: int) -> XLNetSegment:
        j, r = divmod(k, rows)
        if r not in streams:
            block = mine if mine is not None and r in mine else range(r, r + 1)
            tokens, word_starts = text.read(block.start * width, block.stop * width, word_starts=True)
            for i, row in enumerate(block):
                streams[row] = (tokens[i * width:(i + 1) * width], word_starts[i * width:(i + 1) * width])
        tokens, word_starts = streams[r]
        return XLNetSegment(tokens, word_starts, offsets[j], j == 0)
    return LazyRows(len(offsets) * rows, segment)


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
    if stream.lanes:
        rows = stream.first_rows(max_instances)
        return [stream.collate_rows(rows[i:i + batch_size]) for i in range(0, len(rows), batch_size)]
    items: list[tuple[Instance, int, int]] = []
    for inst, epoch, index, _ in stream.instances():
        if epoch > 0 or len(items) >= max_instances:
            break
        items.append((inst, epoch, index))
    return [stream.collate(items[i:i + batch_size]) for i in range(0, len(items), batch_size)]


# ------------------------------------------------------------------------------------------------------------------
# The instance kinds: how the stream makes each (an objective's row in bertkit.models.registry.OBJECTIVES names one)
# ------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class InstanceKind:
    """One kind of instance: made per lane (sentence pairs per document, or packed rows per lane chunk), or per
    whole-corpus chunk (`chunk` makes its rows, `collate` corrupts or permutes them into a batch)."""

    # sentence pairs: (docs, document, options, rng) -> the document's pairs (bertkit.data.instances)
    pairs: Callable[[Any, int, StreamOptions, np.random.Generator], list] | None = None
    cross_documents: bool = False  # packed rows: a row may hold several documents (FULL-SENTENCES)
    # whole-corpus chunks: (stream, documents end to end, the chunk's rng, this process's rows) -> instances
    chunk: Callable[[PretrainingStream, EndToEnd, np.random.Generator, range | None], Sequence[Instance]] | None = None
    collate: Callable[..., dict[str, Any]] | None = None  # (stream, items, state, rows) -> a batch of tensors

    @property
    def lanes(self) -> bool:
        return self.chunk is None


def _xlnet_chunk(stream: PretrainingStream, text: EndToEnd, rng: np.random.Generator,
                 rows: range | None) -> Sequence[XLNetSegment]:
    return _xlnet_rows(text, stream.options.max_seq_length, stream.options.reuse_len, stream.group, rows)


INSTANCE_KINDS: dict[str, InstanceKind] = {
    "nsp": InstanceKind(pairs=lambda docs, d, o, rng: nsp_pairs(docs, d, o.max_seq_length, o.short_seq_prob, rng)),
    "sop": InstanceKind(pairs=lambda docs, d, o, rng: sop_pairs(docs, d, o.max_seq_length, o.short_seq_prob, rng)),
    "sentence-pair": InstanceKind(pairs=lambda docs, d, o, rng: sentence_pairs(docs, d, o.max_seq_length, rng)),
    "full-sentences": InstanceKind(cross_documents=True),
    "doc-sentences": InstanceKind(),
    "spans": InstanceKind(chunk=PretrainingStream._span_sequences, collate=PretrainingStream._collate_spans),
    "xlnet": InstanceKind(chunk=_xlnet_chunk, collate=PretrainingStream._collate_xlnet),
}
OBJECTIVE_INSTANCES = tuple(INSTANCE_KINDS)
LANE_INSTANCES = tuple(name for name, kind in INSTANCE_KINDS.items() if kind.lanes)
