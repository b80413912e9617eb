"""The batching worker: requests are tokenized as they arrive and queued; one thread takes everything
queued (up to the token budget) and runs it through the engine's length-grouped, unpadded batches,
so concurrent requests share forward passes."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from ..inference.engine import FreeMemoryReleaser, InferenceEngine
from .access_log import RequestStats
from .metrics import Metrics

log = logging.getLogger("bertkit")

TRIM_EVERY = 32  # forward rounds between returning freed memory to the system under constant load
IDLE_SECONDS = 0.05  # no request for this long after a batch: the server is idle, trim then
# Returned only once the resident set has grown this much since the last time: a lone request's
# pages (~3 MB on all-MiniLM-L6-v2) stay, so a client sending one input at a time does not fault
# them in again on every request (4-7% of a lone request's forward pass on a 2-core Xeon).
TRIM_GROWTH_BYTES = 16 << 20


@dataclass
class Job:
    rows: list[dict]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    stats: RequestStats | None = None  # the request's access-log figures: queue and compute time
    tokens: int = field(init=False)
    submitted: float = field(init=False, default_factory=time.perf_counter)

    def __post_init__(self):
        self.tokens = sum(len(r["input_ids"]) for r in self.rows)


class Batcher:
    """One thread runs the model: it gathers queued jobs up to the token budget and runs them together."""

    def __init__(self, engine: InferenceEngine, metrics: Metrics, max_batch_tokens: int, warm_up: bool = False,
                 compute_threads: int | None = None):
        """warm_up: the thread runs `engine.warm_up()` before its first job, and the constructor
        returns once it has (re-raising its error), so no request pays for making kernels.
        compute_threads: torch's intra-op threads on this thread (`serve` leaves its own thread one)."""
        self.engine, self.metrics, self.max_batch_tokens = engine, metrics, max_batch_tokens
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.warm_up_error: BaseException | None = None
        warmed_up = threading.Event()
        self.thread = threading.Thread(target=self._work, args=(warm_up, warmed_up, compute_threads),
                                       name="bertkit-batcher", daemon=True)
        self.thread.start()
        warmed_up.wait()
        if self.warm_up_error is not None:
            self.thread.join()
            raise self.warm_up_error

    def submit(self, rows: list[dict], stats: RequestStats | None = None) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        job = Job(rows, loop.create_future(), loop, stats)
        with self.metrics.lock:
            self.metrics.queue_depth += len(rows)
        self.jobs.put(job)
        return job.future

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=30)

    def _work(self, warm_up: bool, warmed_up: threading.Event, compute_threads: int | None) -> None:
        # Inference mode, not only no_grad, for the whole thread: no version counters or autograd
        # bookkeeping per op, about a tenth of a lone MiniLM request's forward pass. The outputs are
        # read (pooled, scored, listed) by the routes, never updated in place.
        with torch.inference_mode():
            try:
                if compute_threads is not None:  # OpenMP's thread count is the calling thread's own
                    torch.set_num_threads(compute_threads)
                if warm_up:  # here, not on the caller's thread: OpenMP's and oneDNN's per-thread state
                    self.engine.warm_up()
            except BaseException as e:
                self.warm_up_error = e
                return
            finally:
                warmed_up.set()
            self._serve_jobs()

    def _serve_jobs(self) -> None:
        rounds = 0
        memory = FreeMemoryReleaser(TRIM_GROWTH_BYTES)
        job = self.jobs.get()
        while True:
            if job is None:
                return
            jobs, tokens = [job], job.tokens
            while tokens < self.max_batch_tokens:
                try:
                    more = self.jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self.jobs.put(None)  # finish this round, then stop
                    break
                jobs.append(more)
                tokens += more.tokens
            self._run(jobs)
            rounds += 1
            if rounds % TRIM_EVERY == 0:  # busy for a while
                memory.release_if_grown()
            try:
                # Under load the next request comes within milliseconds of the last answer; trimming
                # then would hand back pages the next batch faults in again.
                job = self.jobs.get(timeout=IDLE_SECONDS)
            except queue.Empty:  # idle: give the freed memory back, then wait
                memory.release_if_grown()
                job = self.jobs.get()

    def _run(self, jobs: list[Job]) -> None:
        rows = [row for job in jobs for row in job.rows]
        with self.metrics.lock:
            self.metrics.queue_depth -= len(rows)
        started = time.perf_counter()
        try:
            outputs = self.engine.forward(rows, on_batch=self.metrics.batch)
        except Exception as e:  # the model failed: every waiting request gets a 424, the server lives on
            log.exception("forward pass failed")
            for job in jobs:
                job.loop.call_soon_threadsafe(_settle, job.future, None, e)
            return
        finished = time.perf_counter()
        for job in jobs:  # written before the future settles, so the request reads them after
            if job.stats is not None:
                job.stats.queue_seconds += started - job.submitted
                job.stats.compute_seconds += finished - started
        start = 0
        for job in jobs:
            job.loop.call_soon_threadsafe(_settle, job.future, outputs[start:start + len(job.rows)], None)
            start += len(job.rows)


def _settle(future: asyncio.Future, result, error) -> None:
    if future.done():  # the client went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
