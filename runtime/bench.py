"""Benchmarks: the worker pool against the bare runtime, in the same run.

- :func:`measure_bare`: one session, the same thread settings, a tight loop on the same
  input: the floor the pool is compared against.
- :func:`run_closed_loop`: keeps ``depth`` requests in flight; measures throughput.
- :func:`run_open_loop`: sends at a fixed rate whatever the pool does, and counts each
  request's latency from its *intended* send time, so a stall is charged to every
  request it delayed (coordinated-omission correction).

Nothing here asserts a speed: figures are reported, targets are checked by
``edge-runtime targets`` and shown side by side with the measurement.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.backends import BackendOptions, open_model
from runtime.backends.base import Array
from runtime.errors import DeadlineExceeded, EdgeRuntimeError, Overloaded
from runtime.metrics import new_histogram, summarize
from runtime.pool import WorkerPool
from runtime.request import Request

_PR_SET_TIMERSLACK = 29


@dataclass
class LoadResult:
    """Latency (ms percentiles, from intended send time) and counts of one load run."""

    latency: dict[str, float]
    sent: int
    completed: int
    refused: int
    expired: int
    failed: int
    elapsed_s: float
    rate_rps: float | None  # offered rate; None for closed loop
    stages: dict[str, Any] = field(default_factory=dict)
    unfinished: int = 0
    """Sent, not refused, and still in flight when the drain's wait ended: every request
    sent is counted once, in completed, refused, expired, failed or unfinished."""

    @property
    def throughput_rps(self) -> float:
        return self.completed / self.elapsed_s if self.elapsed_s > 0 else 0.0


class Progress:
    """A one-line progress display on stderr (a line every few seconds if not a TTY)."""

    def __init__(self, label: str, total_s: float, enabled: bool = True) -> None:
        self.label = label
        self.total_s = total_s
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self._last = 0.0

    def update(self, elapsed_s: float, text: str) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < (0.25 if self.tty else 5.0):
            return
        self._last = now
        line = f"{self.label}: {min(elapsed_s, self.total_s):4.1f}/{self.total_s:.1f} s  {text}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _tight_timer_slack() -> None:
    """Ask Linux for 1 ns timer slack on this thread, so sleeps end on time."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)


def measure_bare(
    path: str,
    inputs: list[Array],
    *,
    backend: str | None = None,
    threads: int = 1,
    providers: tuple[str, ...] = (),
    delegates: tuple[str, ...] = (),
    duration_s: float = 3.0,
    max_runs: int = 200_000,
    warmup: int = 20,
    progress: bool = True,
) -> LoadResult:
    """Run one session in a tight loop on ``inputs``: latency and throughput."""
    model = open_model(
        path, BackendOptions(threads=threads, providers=providers, delegates=delegates), backend
    )
    try:
        model.prepare({s.name: a.shape for s, a in zip(model.inputs, inputs, strict=True)})
        for _ in range(warmup):
            model.run(inputs)
        hist = new_histogram()
        bar = Progress(
            f"bare runtime ({threads} thread{'s' * (threads > 1)})", duration_s, progress
        )
        start = time.perf_counter_ns()
        end = start + int(duration_s * 1e9)
        runs = 0
        now = start
        while now < end and runs < max_runs:
            t = time.perf_counter_ns()
            model.run(inputs)
            now = time.perf_counter_ns()
            hist.record_value(max(1, (now - t) // 1000))
            runs += 1
            if runs % 200 == 0:
                bar.update((now - start) / 1e9, f"{runs} runs")
        bar.done()
    finally:
        model.close()
    elapsed = (now - start) / 1e9
    return LoadResult(summarize(hist), runs, runs, 0, 0, 0, elapsed, None)


class _Collector:
    """Records completions from the pool's I/O thread."""

    def __init__(self, on_done: Callable[[], None] | None = None) -> None:
        self.hist = new_histogram()
        self.lock = threading.Lock()
        self.completed = 0
        self.expired = 0
        self.failed = 0
        self.on_done = on_done

    def __call__(self, req: Request) -> None:
        now = time.perf_counter_ns()
        err = req.error
        with self.lock:
            if err is None:
                self.hist.record_value(max(1, (now - req.t0_ns) // 1000))
                self.completed += 1
            elif isinstance(err, DeadlineExceeded):
                self.expired += 1
            else:
                self.failed += 1
        req.release()
        if self.on_done is not None:
            self.on_done()


def run_open_loop(
    pool: WorkerPool,
    model: str,
    inputs: list[Array],
    rate_rps: float,
    *,
    duration_s: float = 5.0,
    deadline_s: float | None = None,
    drain_s: float = 5.0,
    progress: bool = True,
) -> LoadResult:
    """Offer ``rate_rps`` requests per second for ``duration_s``, corrected for
    coordinated omission: latency counts from each request's intended send time."""
    if rate_rps <= 0:
        raise ValueError(f"rate must be > 0, got {rate_rps}")
    _tight_timer_slack()
    collector = _Collector()
    period_ns = int(1e9 / rate_rps)
    total = max(1, int(rate_rps * duration_s))
    refused = 0
    bar = Progress(f"pool open loop at {rate_rps:.0f} rps", duration_s, progress)
    start = time.perf_counter_ns() + 1_000_000
    for i in range(total):
        intended = start + i * period_ns
        delay = intended - time.perf_counter_ns()
        if delay > 0:
            time.sleep(delay / 1e9)
        try:
            pool.submit(model, inputs, t0_ns=intended, deadline_s=deadline_s, callback=collector)
        except Overloaded:
            refused += 1
        if i % 100 == 0:
            bar.update(
                (time.perf_counter_ns() - start) / 1e9,
                f"sent {i + 1}  done {collector.completed}  refused {refused}",
            )
    _wait_for(
        lambda: collector.completed + collector.expired + collector.failed + refused >= total,
        drain_s,
    )
    bar.done()
    elapsed = (time.perf_counter_ns() - start) / 1e9
    with collector.lock:
        done = collector.completed + collector.expired + collector.failed + refused
        return LoadResult(
            summarize(collector.hist),
            total,
            collector.completed,
            refused,
            collector.expired,
            collector.failed,
            min(elapsed, duration_s) if collector.completed else elapsed,
            rate_rps,
            unfinished=max(0, total - done),
        )


def run_closed_loop(
    pool: WorkerPool,
    model: str,
    inputs: list[Array],
    *,
    depth: int | None = None,
    duration_s: float = 3.0,
    progress: bool = True,
) -> LoadResult:
    """Keep ``depth`` requests in flight (default 2 per worker) for ``duration_s``."""
    depth = depth or 2 * pool.config.workers
    stop_at = time.perf_counter_ns() + int(duration_s * 1e9)
    sent = [0]
    lock = threading.Lock()

    def refill() -> None:
        if time.perf_counter_ns() >= stop_at:
            return
        with lock:
            sent[0] += 1
        with contextlib.suppress(EdgeRuntimeError):
            pool.submit(model, inputs, callback=collector)

    collector = _Collector(on_done=refill)
    bar = Progress(f"pool closed loop, {pool.config.workers} worker(s)", duration_s, progress)
    start = time.perf_counter_ns()
    for _ in range(depth):
        refill()
    while time.perf_counter_ns() < stop_at:
        time.sleep(0.05)
        bar.update((time.perf_counter_ns() - start) / 1e9, f"done {collector.completed}")
    _wait_for(lambda: collector.completed + collector.failed + collector.expired >= sent[0], 5.0)
    bar.done()
    end = time.perf_counter_ns()
    with collector.lock:
        done = collector.completed + collector.expired + collector.failed
        return LoadResult(
            summarize(collector.hist),
            sent[0],
            collector.completed,
            0,
            collector.expired,
            collector.failed,
            (end - start) / 1e9,
            None,
            unfinished=max(0, sent[0] - done),
        )


def _wait_for(cond: Callable[[], bool], timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def sample_input(specs: list[Any], seed: int = 0) -> list[Array]:
    """A deterministic random input for each model input (images in [0, 1) or 0..255)."""
    rng = np.random.default_rng(seed)
    arrays: list[Array] = []
    for spec in specs:
        shape = spec.concrete_shape()
        if np.issubdtype(spec.dtype, np.integer):
            arrays.append(rng.integers(0, 256, size=shape).astype(spec.dtype))
        else:
            arrays.append(rng.random(shape, dtype=np.float32).astype(spec.dtype))
    return arrays
