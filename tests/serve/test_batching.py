"""The token-budget batcher on its own: rows of many concurrent requests grouped under the budget, every output
back to its caller in order, the wait bound, failures confined to their batch, a bounded queue, a draining stop."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from bertkit.serve.batching import Batcher, QueueFull


class Recorder:
    """A forward pass that doubles every number of every row, remembering each batch's rows."""

    def __init__(self, delay: float = 0.0, fail_when=None) -> None:
        self.batches: list[list[list[int]]] = []
        self.delay, self.fail_when = delay, fail_when
        self.lock = threading.Lock()

    def __call__(self, rows):
        with self.lock:
            self.batches.append([list(r) for r in rows])
        if self.delay:
            time.sleep(self.delay)
        if self.fail_when is not None and self.fail_when(rows):
            raise RuntimeError("the forward pass failed")
        return [[2 * x for x in r] for r in rows]


def run(coro):
    return asyncio.run(coro)


def test_concurrent_requests_share_batches_within_the_budget_and_get_their_own_outputs_in_order():
    rng = random.Random(0)
    # 200 requests of 1-5 rows of 1-40 "tokens"; every number unique, so a misrouted output cannot pass.
    counter = iter(range(10 ** 6))
    requests = [[[next(counter) for _ in range(rng.randint(1, 40))] for _ in range(rng.randint(1, 5))]
                for _ in range(200)]
    forward = Recorder(delay=0.002)
    seen = []

    async def main():
        batcher = Batcher(forward, max_batch_tokens=256, max_wait_ms=20, on_batch=seen.append)
        batcher.start()

        async def client(rows, pause):
            await asyncio.sleep(pause)
            return await batcher.submit(rows)

        results = await asyncio.gather(*[client(r, rng.random() * 0.05) for r in requests])
        await batcher.stop()
        return results

    results = run(main())
    for rows, got in zip(requests, results):
        assert got == [[2 * x for x in r] for r in rows]
    ran = [row for batch in forward.batches for row in batch]
    assert sorted(map(tuple, ran)) == sorted(tuple(r) for rows in requests for r in rows)  # each row once
    for batch in forward.batches:
        tokens = sum(map(len, batch))
        assert tokens <= 256 or len(batch) == 1
    assert len(forward.batches) < sum(map(len, requests)) / 4  # real grouping: several rows per pass
    assert max(s.requests for s in seen) > 3  # rows of different requests shared a pass
    assert sum(len(s.queue_seconds) for s in seen) == len(requests)  # every request's wait recorded once


def test_a_full_budget_goes_at_once_and_a_lone_request_waits_at_most_max_wait():
    forward = Recorder()

    async def main():
        batcher = Batcher(forward, max_batch_tokens=10, max_wait_ms=400)
        batcher.start()
        start = time.perf_counter()
        await asyncio.gather(batcher.submit([[1] * 6]), batcher.submit([[2] * 4]))  # 10 tokens: the budget
        full = time.perf_counter() - start
        start = time.perf_counter()
        await batcher.submit([[3]])
        lone = time.perf_counter() - start
        await batcher.stop()
        return full, lone

    full, lone = run(main())
    assert full < 0.3  # the first row (6 tokens) waits for more; with the second the budget is full: no wait
    assert 0.35 <= lone < 2.0
    assert forward.batches == [[[1] * 6, [2] * 4], [[3]]]


def test_a_row_longer_than_the_budget_runs_alone():
    forward = Recorder()

    async def main():
        batcher = Batcher(forward, max_batch_tokens=4, max_wait_ms=0)
        batcher.start()
        out = await batcher.submit([[1] * 9, [2] * 2])
        await batcher.stop()
        return out

    assert run(main()) == [[2] * 9, [4] * 2]
    assert forward.batches == [[[1] * 9], [[2] * 2]]


def test_a_failing_forward_fails_only_its_batch_and_the_worker_goes_on():
    forward = Recorder(fail_when=lambda rows: any(r[0] == 13 for r in rows))

    async def main():
        batcher = Batcher(forward, max_batch_tokens=4, max_wait_ms=0)
        batcher.start()
        results = await asyncio.gather(batcher.submit([[13, 13, 13, 13]]), batcher.submit([[5, 5, 5, 5]]),
                                       return_exceptions=True)
        after = await batcher.submit([[7]])
        await batcher.stop()
        return results, after

    (failed, ok), after = run(main())
    assert isinstance(failed, RuntimeError) and ok == [[10] * 4] and after == [[14]]


def test_the_queue_is_bounded_and_says_when_to_retry():
    forward = Recorder(delay=0.3)

    async def main():
        batcher = Batcher(forward, max_batch_tokens=1, max_wait_ms=0, max_queue=2)
        batcher.start()
        first = asyncio.ensure_future(batcher.submit([[1]]))
        await asyncio.sleep(0.05)  # the first is in the forward pass: no longer waiting
        waiting = [asyncio.ensure_future(batcher.submit([[i]])) for i in (2, 3)]
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFull) as full:
            await batcher.submit([[4]])
        results = await asyncio.gather(first, *waiting)
        await batcher.stop()
        return full.value, results

    full, results = run(main())
    assert full.retry_after >= 1 and "2 requests waiting" in str(full)
    assert results == [[[2]], [[4]], [[6]]]


def test_stop_runs_what_is_queued_then_refuses():
    forward = Recorder(delay=0.05)

    async def main():
        batcher = Batcher(forward, max_batch_tokens=3, max_wait_ms=1000)
        batcher.start()
        pending = [asyncio.ensure_future(batcher.submit([[i, i]])) for i in range(5)]
        await asyncio.sleep(0.01)
        await batcher.stop()  # long before the 1 s wait is over
        results = [p.result() for p in pending]
        with pytest.raises(QueueFull):
            await batcher.submit([[9]])
        return results

    assert run(main()) == [[[2 * i, 2 * i]] for i in range(5)]


def test_rows_of_a_cancelled_request_are_dropped():
    forward = Recorder(delay=0.2)

    async def main():
        batcher = Batcher(forward, max_batch_tokens=1, max_wait_ms=0)
        batcher.start()
        first = asyncio.ensure_future(batcher.submit([[1]]))
        await asyncio.sleep(0.05)
        gone = asyncio.ensure_future(batcher.submit([[2], [3]]))
        await asyncio.sleep(0.01)
        gone.cancel()
        kept = await batcher.submit([[4]])
        await first
        await batcher.stop()
        return kept

    assert run(main()) == [[8]]
    assert [b for b in forward.batches] == [[[1]], [[4]]]


def test_several_workers_run_passes_at_once_each_thread_initialised_first():
    """workers=2: two passes are inside `forward` at the same time (a barrier of two that one pass alone would
    never pass), each in a thread the initializer ran in first; a failing pass fails only its own requests; the
    outputs still go to their callers in order."""
    barrier = threading.Barrier(2, timeout=10)
    initialised, ran = set(), []

    def forward(rows):
        ran.append(threading.get_ident())
        if rows[0][0] < 2:  # the first two passes (one row each) must overlap
            barrier.wait()
        if rows[0][0] == 3:
            raise RuntimeError("the forward pass failed")
        return [[2 * x for x in r] for r in rows]

    async def main():
        batcher = Batcher(forward, max_batch_tokens=1, max_wait_ms=0, workers=2,
                          initializer=lambda: initialised.add(threading.get_ident()))
        batcher.start()
        results = await asyncio.gather(*[batcher.submit([[i]]) for i in range(6)], return_exceptions=True)
        await batcher.stop()
        return results

    results = run(main())
    assert [r if isinstance(r, list) else type(r) for r in results] == [[[0]], [[2]], [[4]], RuntimeError, [[8]],
                                                                          [[10]]]
    assert len(set(ran)) == 2 and set(ran) <= initialised
    with pytest.raises(ValueError, match="workers"):
        Batcher(forward, workers=0)


def test_one_worker_never_runs_two_passes_at_once():
    inside, most = [0], [0]
    lock = threading.Lock()

    def forward(rows):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.01)
        with lock:
            inside[0] -= 1
        return rows

    async def main():
        batcher = Batcher(forward, max_batch_tokens=1, max_wait_ms=0)
        batcher.start()
        await asyncio.gather(*[batcher.submit([[i]]) for i in range(8)])
        await batcher.stop()

    run(main())
    assert most[0] == 1
