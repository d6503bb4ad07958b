"""The server's counters in Prometheus' text exposition format (version 0.0.4), written without a client library.

    bertkit_requests_total{path, code}        requests answered, by route and status code
    bertkit_request_seconds                   histogram of request latency (POST /v1/predict)
    bertkit_inputs_total{result}              inputs answered ("ok") or answered with an error object ("error")
    bertkit_batches_total{result}             forward passes ("ok", "failed")
    bertkit_batch_rows, bertkit_batch_tokens  histograms of a forward pass's rows and real tokens
    bertkit_queue_seconds                     histogram of a request's wait from arrival to its first batch
    bertkit_forward_seconds                   histogram of a forward pass's duration
    bertkit_tokens_total                      real tokens run (its rate is the tokens per second)
    bertkit_tokens_per_second                 recent forward throughput, real tokens per second (a gauge)
    bertkit_queue_requests, bertkit_queue_tokens, bertkit_in_flight_requests   gauges
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Callable

from bertkit.serve.batching import BatchStats


class Histogram:
    """Cumulative buckets, sum and count, as Prometheus histograms are exposed."""

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = sorted(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip(self.bounds + [float("inf")], self.counts):
            running += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            out.append(f'{name}_bucket{{le="{le}"}} {running}')
        return out + [f"{name}_sum {self.sum:.6g}", f"{name}_count {self.count}"]


SECONDS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]


class Metrics:
    """Everything /metrics shows; `gauges` reads the live values (queue, in flight, throughput) when rendered."""

    def __init__(self, gauges: Callable[[], dict[str, float]] | None = None) -> None:
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.inputs: dict[str, int] = defaultdict(int)
        self.batches: dict[str, int] = defaultdict(int)
        self.tokens = 0
        self.request_seconds = Histogram(SECONDS)
        self.queue_seconds = Histogram(SECONDS)
        self.forward_seconds = Histogram(SECONDS)
        self.batch_rows = Histogram([1, 2, 4, 8, 16, 32, 64, 128, 256])
        self.batch_tokens = Histogram([16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192])
        self.gauges = gauges

    def request(self, path: str, code: int, seconds: float | None = None) -> None:
        self.requests[(path, code)] += 1
        if seconds is not None:
            self.request_seconds.observe(seconds)

    def batch(self, stats: BatchStats) -> None:
        self.batches["failed" if stats.failed else "ok"] += 1
        self.batch_rows.observe(stats.rows)
        self.batch_tokens.observe(stats.tokens)
        self.forward_seconds.observe(stats.forward_seconds)
        for seconds in stats.queue_seconds:
            self.queue_seconds.observe(seconds)
        if not stats.failed:
            self.tokens += stats.tokens

    def render(self) -> str:
        """The exposition text (content type `text/plain; version=0.0.4`)."""
        lines: list[str] = []

        def family(name: str, kind: str, text: str, body: list[str]) -> None:
            lines.extend([f"# HELP {name} {text}", f"# TYPE {name} {kind}", *body])

        family("bertkit_requests_total", "counter", "HTTP requests answered, by path and status code.",
               [f'bertkit_requests_total{{path="{p}",code="{c}"}} {n}' for (p, c), n in sorted(self.requests.items())])
        family("bertkit_request_seconds", "histogram", "Latency of POST /v1/predict.",
               self.request_seconds.lines("bertkit_request_seconds"))
        family("bertkit_inputs_total", "counter", "Inputs answered, by result (ok, error).",
               [f'bertkit_inputs_total{{result="{r}"}} {n}' for r, n in sorted(self.inputs.items())])
        family("bertkit_batches_total", "counter", "Forward passes, by result (ok, failed).",
               [f'bertkit_batches_total{{result="{r}"}} {n}' for r, n in sorted(self.batches.items())])
        family("bertkit_batch_rows", "histogram", "Rows (sequences) per forward pass.",
               self.batch_rows.lines("bertkit_batch_rows"))
        family("bertkit_batch_tokens", "histogram", "Real tokens per forward pass.",
               self.batch_tokens.lines("bertkit_batch_tokens"))
        family("bertkit_queue_seconds", "histogram", "Wait of a request from its arrival to its first batch.",
               self.queue_seconds.lines("bertkit_queue_seconds"))
        family("bertkit_forward_seconds", "histogram", "Duration of a forward pass.",
               self.forward_seconds.lines("bertkit_forward_seconds"))
        family("bertkit_tokens_total", "counter", "Real tokens run through the model.",
               [f"bertkit_tokens_total {self.tokens}"])
        for name, value in (self.gauges() if self.gauges else {}).items():
            family(f"bertkit_{name}", "gauge", name.replace("_", " ").capitalize() + ".",
                   [f"bertkit_{name} {value:.6g}"])
        return "\n".join(lines) + "\n"
