"""Dynamic batching by token budget: requests wait in a queue, a worker groups their rows into forward passes.

NVIDIA Triton's dynamic batcher is the idea, with the budget counted in real tokens instead of requests: the
model runs on the real tokens only (unpadded), so what a forward pass costs is the number of tokens in it, not
the number of rows times the longest. The worker

    1. waits for the first row, then for more until the rows waiting hold `max_batch_tokens` real tokens or the
       oldest has waited `max_wait_ms` (a batch that is full goes at once; a lone request waits at most that long);
    2. takes rows in arrival order while they fit the budget (always at least one row, so a row longer than the
       budget still runs, alone);
    3. runs the forward pass in a thread of its own, so the event loop keeps accepting requests, which queue up
       for the next batch meanwhile;
    4. hands every row's output to its request; a request resolves when all its rows have run, with the outputs
       in its rows' order.

With `workers` > 1 that many forward passes run at once, each in its own thread (`initializer` runs first in
each: the server gives each its share of the torch threads): while one computes, the next batch forms and starts
on the other. On a CPU two passes of one thread each keep two cores busier than one pass of two threads, whose
threads wait for each other at every operation and for the batch to form between passes.

A request's rows may be split over several batches (a long SQuAD passage's windows). A forward pass that raises
fails only the requests with rows in it; the worker goes on. `max_queue` bounds the requests waiting: past it
`submit` raises `QueueFull`, with an estimate of when to retry from the recent tokens per second. `stop` lets the
worker finish every row already queued (graceful shutdown), then ends it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


class QueueFull(Exception):
    """The queue holds `max_queue` requests (or the server is stopping); retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class _Job:
    """One request's rows, what has come back of them, and the future its caller awaits."""

    rows: Sequence[Any]
    future: asyncio.Future
    arrival: float
    outputs: list = field(default_factory=list)
    remaining: int = 0
    started: bool = False  # some row is in a batch: the job no longer counts as waiting


@dataclass
class BatchStats:
    """What one forward pass was, for the metrics: rows, real tokens, the longest wait and its duration."""

    rows: int
    tokens: int
    requests: int
    queue_seconds: list[float]  # per request whose first row is in this batch: arrival -> batch start
    forward_seconds: float
    failed: bool = False


class Batcher:
    """The queue and its worker; see the module docstring.

    Args:
        forward: rows -> one output per row; runs in the worker's own thread.
        max_batch_tokens: the budget of one forward pass, in real tokens (the rows' lengths).
        max_wait_ms: how long the oldest waiting row may wait for a batch to fill.
        max_queue: requests that may wait; more raise QueueFull.
        workers: forward passes that may run at once, each in a thread of its own.
        initializer: called once in each forward thread before its first pass.
        length: a row's token count (default len).
        on_batch: called with a BatchStats after every forward pass (in the event loop).
    """

    def __init__(self, forward: Callable[[list], list], *, max_batch_tokens: int = 2048, max_wait_ms: float = 5.0,
                 max_queue: int = 1024, workers: int = 1, initializer: Callable[[], None] | None = None,
                 length: Callable[[Any], int] = len,
                 on_batch: Callable[[BatchStats], None] | None = None) -> None:
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be at least 1, got {max_batch_tokens}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be at least 0, got {max_wait_ms}")
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.workers, self.initializer = workers, initializer
        self.forward, self.length, self.on_batch = forward, length, on_batch
        self.max_batch_tokens, self.max_wait, self.max_queue = max_batch_tokens, max_wait_ms / 1000, max_queue
        self._pending: deque[tuple[_Job, int]] = deque()  # (job, row index), arrival order
        self.queued_tokens = 0  # real tokens of the rows waiting
        self.queued_requests = 0  # requests none of whose rows is in a batch yet
        self._executor: ThreadPoolExecutor | None = None
        self._worker: asyncio.Task | None = None
        self._arrived: asyncio.Event | None = None
        self._closing = False
        self.tokens_per_second = 0.0  # recent throughput of the forward passes (an exponential average)
        self.in_flight = 0  # requests submitted and not yet resolved

    # ---- life cycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker in the running event loop."""
        self._arrived = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="bertkit-forward",
                                            initializer=self.initializer)
        self._closing = False
        self._worker = asyncio.get_running_loop().create_task(self._run(), name="bertkit-batcher")

    async def stop(self) -> None:
        """Refuse new requests, run every row already queued, then end the worker and its thread."""
        self._closing = True
        if self._arrived is not None:
            self._arrived.set()
        if self._worker is not None:
            await self._worker
            self._worker = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    @property
    def running(self) -> bool:
        """Whether the worker runs (started, not stopped, not ended by an error)."""
        return self._worker is not None and not self._worker.done() and not self._closing

    # ---- submitting ------------------------------------------------------------------------------------------
    async def submit(self, rows: Sequence[Any]) -> list:
        """Queue a request's rows and wait for their outputs (in the same order).

        Raises QueueFull when `max_queue` requests are waiting or the batcher is stopping; whatever the forward
        pass raised for a batch holding one of the rows.
        """
        if self._worker is None or self._closing:
            raise QueueFull("the server is shutting down", retry_after=5)
        if self.queued_requests >= self.max_queue:
            raise QueueFull(f"the queue is full ({self.queued_requests} requests waiting)",
                            retry_after=self.retry_after())
        loop = asyncio.get_running_loop()
        job = _Job(list(rows), loop.create_future(), time.perf_counter())
        if not job.rows:
            return []
        job.outputs, job.remaining = [None] * len(job.rows), len(job.rows)
        for i, row in enumerate(job.rows):
            self._pending.append((job, i))
            self.queued_tokens += self.length(row)
        self.queued_requests += 1
        self.in_flight += 1
        self._arrived.set()
        try:
            return await job.future
        finally:
            self.in_flight -= 1

    def retry_after(self) -> int:
        """Seconds until the queued tokens are likely done, at the recent rate (1 to 60)."""
        if self.tokens_per_second <= 0:
            return 1
        return int(min(60, max(1, math.ceil(self.queued_tokens / self.tokens_per_second))))

    # ---- the worker ------------------------------------------------------------------------------------------
    def _take(self) -> list[tuple[_Job, int]]:
        """Rows in arrival order while they fit the budget (at least one), skipping those of cancelled requests."""
        batch: list[tuple[_Job, int]] = []
        tokens = 0
        while self._pending:
            job, i = self._pending[0]
            n = self.length(job.rows[i])
            if job.future.done():  # its caller went away (a cancelled request): drop the row
                self._pending.popleft()
                self.queued_tokens -= n
                if not job.started:
                    job.started = True
                    self.queued_requests -= 1
                continue
            if batch and tokens + n > self.max_batch_tokens:
                break
            self._pending.popleft()
            self.queued_tokens -= n
            tokens += n
            batch.append((job, i))
        return batch

    async def _gather(self) -> None:
        """Wait until a batch should go: the budget is full, the oldest row has waited max_wait, or stopping."""
        while not self._pending:
            if self._closing:
                return
            self._arrived.clear()
            await self._arrived.wait()
        deadline = self._pending[0][0].arrival + self.max_wait
        while self.queued_tokens < self.max_batch_tokens and not self._closing:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                return

    async def _run(self) -> None:
        """Form batches while a worker is free; each runs as a task of its own (`_pass`)."""
        free = asyncio.Semaphore(self.workers)
        passes: set[asyncio.Task] = set()
        try:
            while True:
                await free.acquire()
                await self._gather()
                batch = self._take() if self._pending else []
                if not batch:
                    free.release()
                    if self._closing and not self._pending:
                        return
                    continue
                task = asyncio.get_running_loop().create_task(self._pass(batch))
                passes.add(task)
                task.add_done_callback(lambda done: (passes.discard(done), free.release()))
        finally:
            if passes:
                await asyncio.gather(*passes, return_exceptions=True)

    async def _pass(self, batch: list[tuple[_Job, int]]) -> None:
        """One forward pass over `batch` in a worker thread; its outputs to their requests, its stats to
        `on_batch`."""
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        waited = []
        for job, _ in batch:
            if not job.started:
                job.started = True
                self.queued_requests -= 1
                waited.append(start - job.arrival)
        rows = [job.rows[i] for job, i in batch]
        tokens = sum(self.length(r) for r in rows)
        failed = False
        try:
            outputs = await loop.run_in_executor(self._executor, self.forward, rows)
            if len(outputs) != len(rows):
                raise RuntimeError(f"the forward pass gave {len(outputs)} outputs for {len(rows)} rows")
        except Exception as err:  # fail this batch's requests, keep the worker
            failed = True
            for job, _ in batch:
                if not job.future.done():
                    job.future.set_exception(err)
        seconds = time.perf_counter() - start
        if not failed:
            rate = tokens / max(seconds, 1e-9) * self.workers  # passes overlap: the server's rate, not one pass's
            self.tokens_per_second = rate if self.tokens_per_second == 0 else (
                0.8 * self.tokens_per_second + 0.2 * rate)
            for (job, i), out in zip(batch, outputs):
                if job.future.done():
                    continue
                job.outputs[i] = out
                job.remaining -= 1
                if job.remaining == 0:
                    job.future.set_result(job.outputs)
        if self.on_batch is not None:
            try:
                self.on_batch(BatchStats(len(rows), tokens, len({id(job) for job, _ in batch}), waited,
                                         seconds, failed))
            except Exception:  # the metrics must never stop the worker
                pass
