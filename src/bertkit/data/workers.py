"""The one way batches leave worker processes: `worker_items` runs a dataset in torch DataLoader workers, each
batch travels as one flat byte array (`pack_batch`, `unpack_batch`, `unpack_pinned`), and a batch's shares made by
several workers are joined into one (`join_shares`). The pretraining stream (`bertkit.data.loader`) and the
fine-tuning batches (`bertkit.tasks.run.EpochBatches`) both use it.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from bertkit.errors import DataError
from bertkit.io import close_inherited_locks


def _as_is(item: Any) -> Any:
    return item


def _worker_start(worker_id: int) -> None:
    close_inherited_locks()


def worker_items(dataset: torch.utils.data.IterableDataset, workers: int, prefetch: int, seed: int,
                 rank: int) -> Iterator[tuple[np.ndarray, list, dict[str, Any]]]:
    """The items (`pack_batch`ed batches, or shares of one) that `workers` processes make from `dataset`, in
    round-robin order: item k comes from worker k mod `workers` (torch's DataLoader keeps that order). The one way
    batches leave worker processes, for the pretraining stream and the fine-tuning batches
    (`bertkit.tasks.run.EpochBatches`) alike.

    A worker that dies ends the iteration with one line (`DataError` naming the rank); what a live worker raises
    comes through as itself. Closing the generator shuts the workers down at once."""
    # A generator of its own: the DataLoader draws its workers' base seed from it, and a draw from the global
    # one would shift the training's dropout (a resumed run, or one with --workers 0, would then differ)
    # collate_fn: the items are packed already (`pack_batch`); the default would walk every position list in them
    # worker_init_fn: a worker holds no copy of the run directory's lock, so a killed run's directory is free
    # for `--resume` at once (not when its orphaned workers notice, seconds later)
    loader = DataLoader(dataset, batch_size=None, num_workers=workers, collate_fn=_as_is,
                        prefetch_factor=max(prefetch, 1), persistent_workers=False,
                        generator=torch.Generator().manual_seed(seed), worker_init_fn=_worker_start)
    # The workers are forked here. gc.freeze: the objects this process holds move to a generation the children's
    # garbage collector never walks; walked, every page holding one is copied into the child (copy on write):
    # measured, a quarter fewer page faults and a fifth less CPU in a worker making 300 NSP batches of 64
    gc.freeze()
    try:
        items = iter(loader)
    finally:
        gc.unfreeze()  # this process collects as before
    try:
        yield from items
    except (RuntimeError, ConnectionError, EOFError) as err:
        # A dead worker shows as torch's "DataLoader worker ... exited/killed", or as its pipe breaking under
        # the read; what a live worker raises comes through as itself
        if isinstance(err, RuntimeError) and "DataLoader worker" not in str(err):
            raise
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(f"a data loader worker process of rank {rank} died ({why}); continue from the "
                        f"last checkpoint with --resume") from None
    finally:
        # Shut the workers down now: a traceback that holds the iterator would keep them (and torch's SIGCHLD
        # watch over them, which raises wherever the process then is) alive
        shutdown = getattr(items, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def unpack_pinned(item: tuple[np.ndarray, list, dict[str, Any]]) -> dict[str, Any]:
    """`unpack_batch` into pinned memory (one block for the whole batch): every field is a pinned view, so the
    trainer's copy to the GPU (non_blocking) waits for nothing."""
    return _unpacked(item, pin=True)


_NARROW = (torch.int8, torch.int16, torch.int32)  # integer dtypes a field travels in, narrowest first


def _wire_dtype(value: torch.Tensor) -> torch.dtype:
    """The narrowest integer dtype that holds every value of an int64/int32 tensor; bool for a float32 tensor of
    zeros and ones (XLNet's perm_mask and target_mapping, most of its batch's bytes); its own dtype otherwise."""
    if value.dtype == torch.float32 and value.numel() > 0:
        bits = value.reshape(-1).view(torch.int32)  # +0.0 and 1.0 exactly (not -0.0), bit for bit
        zero_or_one = (bits == 0) | (bits == 0x3F800000)
        return torch.bool if bool(zero_or_one.all()) else value.dtype
    if value.dtype not in (torch.int64, torch.int32) or value.numel() == 0:
        return value.dtype
    low, high = (int(x) for x in torch.aminmax(value))
    for dtype in _NARROW:
        info = torch.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return dtype if dtype.itemsize < value.dtype.itemsize else value.dtype
    return value.dtype


def pack_batch(batch: dict[str, Any]) -> tuple[np.ndarray, list[tuple[str, torch.dtype, tuple[int, ...], int,
                                                                       torch.dtype]], dict[str, Any]]:
    """A batch as one flat byte array, its layout (name, dtype, shape, offset, dtype on the wire) and the rest
    (positions, flags). Integer fields travel in the narrowest dtype that holds their values (token ids in 16
    or 32 bits, masks in 8) and `unpack_batch` widens them back: the same values and dtypes arrive.

    Why: each tensor a worker hands over becomes a shared-memory segment of its own, created, sent as a file
    descriptor and mapped again per item (about a millisecond each, measured), which cost more than making the
    rows; one numpy array per batch goes through the worker's pipe as plain bytes (one copy each side), and a
    narrow one fits the pipe's buffer in one write (a 256-row batch of int64s took a dozen reads, each waiting
    for the worker's next write)."""
    tensors = [(k, v) for k, v in batch.items() if isinstance(v, torch.Tensor)]
    layout, offset = [], 0
    for name, value in tensors:
        wire = _wire_dtype(value)
        layout.append((name, value.dtype, tuple(value.shape), offset, wire))
        offset += -(-value.numel() * wire.itemsize // 8) * 8  # 8-byte aligned, so every view is aligned
    flat = np.empty(offset, dtype=np.uint8)
    view = torch.from_numpy(flat)
    for (name, value), (_, dtype, shape, start, wire) in zip(tensors, layout):
        size = value.numel() * wire.itemsize
        view[start:start + size].view(wire).copy_(value.reshape(-1))
    return flat, layout, {k: v for k, v in batch.items() if not isinstance(v, torch.Tensor)}


def unpack_batch(item: tuple[np.ndarray, list, dict[str, Any]]) -> dict[str, Any]:
    """The batch `pack_batch` made, in the original key order: views into its flat tensor where a field travelled
    in its own dtype, widened copies where it travelled narrower."""
    return _unpacked(item, pin=False)


def _unpacked(item: tuple[np.ndarray, list, dict[str, Any]], pin: bool) -> dict[str, Any]:
    flat, layout, rest = item
    flat = torch.from_numpy(flat) if isinstance(flat, np.ndarray) else flat
    fields = [(name, flat[start:start + math.prod(shape) * wire.itemsize].view(wire).view(shape), dtype)
              for name, dtype, shape, start, wire in layout]
    if not pin and all(value.dtype == dtype for _, value, dtype in fields):
        out: dict[str, Any] = {name: value for name, value, _ in fields}
    else:  # widen into one block (pinned when asked), each field a view of it
        sizes = [-(-value.numel() * dtype.itemsize // 8) * 8 for _, value, dtype in fields]
        block = torch.empty(sum(sizes), dtype=torch.uint8, pin_memory=pin)
        out, start = {}, 0
        for (name, value, dtype), size in zip(fields, sizes):
            target = block[start:start + value.numel() * dtype.itemsize].view(dtype).view(value.shape)
            if value.dtype == dtype:
                target.copy_(value)
            else:  # numpy's cast: torch's copy_ across dtypes took 20 ms for XLNet's (64, 128, 128) perm_mask
                np.copyto(target.numpy(), value.numpy(), casting="unsafe")
            out[name], start = target, start + size
    out.update(rest)
    return out


def join_shares(parts: list[dict[str, Any]], lanes: bool, pin: bool) -> dict[str, Any]:
    """One batch from its shares (in row order): tensors concatenated along the rows (into pinned memory when
    `pin`), lane positions concatenated."""
    out: dict[str, Any] = {}
    for key, value in parts[0].items():
        if isinstance(value, torch.Tensor):
            tensors = [p[key] for p in parts]
            if len(tensors) == 1:
                joined = tensors[0].pin_memory() if pin else tensors[0]
            else:
                shape = (sum(t.shape[0] for t in tensors),) + tuple(tensors[0].shape[1:])
                joined = torch.empty(shape, dtype=value.dtype, pin_memory=pin)
                torch.cat(tensors, out=joined)
            out[key] = joined
        elif key == "_state":
            state = dict(value)
            if lanes:
                state["lanes"] = [lane for p in parts for lane in p["_state"]["lanes"]]
            out[key] = state
        else:
            out[key] = value
    return out
