"""Prometheus counters of the server: requests by route and status, latency, batch sizes, queue depth."""

from __future__ import annotations

import threading

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Histogram:
    def __init__(self, buckets):
        self.buckets, self.counts, self.total, self.count = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.total}" if labels else f"{name}_sum {self.total}")
        out.append(f"{name}_count{{{labels}}} {self.count}" if labels else f"{name}_count {self.count}")
        return out


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.latency = Histogram(LATENCY_BUCKETS)
        self.batch_rows = Histogram(BATCH_BUCKETS)
        self.batch_tokens = 0
        self.queue_depth = 0  # inputs waiting for the worker
        self.in_flight = 0

    def request(self, route: str, status: int, seconds: float) -> None:
        with self.lock:
            self.requests[(route, status)] = self.requests.get((route, status), 0) + 1
            self.latency.observe(seconds)

    def batch(self, rows: int, tokens: int) -> None:
        with self.lock:
            self.batch_rows.observe(rows)
            self.batch_tokens += tokens

    def text(self) -> str:
        with self.lock:
            lines = ["# HELP bertkit_requests_total HTTP requests by route and status.",
                     "# TYPE bertkit_requests_total counter"]
            lines += [f'bertkit_requests_total{{route="{r}",status="{s}"}} {n}' for (r, s), n in sorted(self.requests.items())]
            lines += ["# HELP bertkit_request_duration_seconds Request latency.",
                      "# TYPE bertkit_request_duration_seconds histogram"]
            lines += self.latency.lines("bertkit_request_duration_seconds")
            lines += ["# HELP bertkit_batch_size Rows per forward pass.", "# TYPE bertkit_batch_size histogram"]
            lines += self.batch_rows.lines("bertkit_batch_size")
            lines += ["# HELP bertkit_batch_tokens_total Padded tokens run.", "# TYPE bertkit_batch_tokens_total counter",
                      f"bertkit_batch_tokens_total {self.batch_tokens}",
                      "# HELP bertkit_queue_size Inputs waiting for the model.", "# TYPE bertkit_queue_size gauge",
                      f"bertkit_queue_size {self.queue_depth}",
                      "# HELP bertkit_requests_in_flight Requests being served.", "# TYPE bertkit_requests_in_flight gauge",
                      f"bertkit_requests_in_flight {self.in_flight}"]
            return "\n".join(lines) + "\n"
