"""Load, warm-up and self-benchmark of a staged bundle in a real worker pool, and the
default health probe that keeps running it through the health window.

The sample input is a frame of zeros of the manifest's preprocess size (or a tensor of
zeros of the model's input when the bundle has no preprocessing): deterministic, and
the same work per run as any real frame of that size.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from agent.installer.errors import InstallError
from agent.installer.machine import Step
from agent.kernel.bundle import Bundle
from agent.kernel.errors import BundleError
from runtime import PoolConfig, WorkerPool
from runtime.errors import EdgeRuntimeError, PoolClosed, WorkerCrashed

log = logging.getLogger(__name__)

MODEL = "trial"


@dataclass(frozen=True)
class BenchResult:
    """The self-benchmark's figures, in milliseconds."""

    runs: int
    p50_ms: float
    p95_ms: float
    max_ms: float
    budget_ms: float


class Trial:
    """A staged bundle running in its own one-worker pool."""

    def __init__(self, bundle: Bundle, pool: WorkerPool, timeout_s: float) -> None:
        self.bundle = bundle
        self.pool = pool
        self.timeout_s = timeout_s
        pre = bundle.manifest.preprocess
        if pre is not None:
            self._frame: np.ndarray | None = np.zeros(
                (pre.height, pre.width, pre.channels), np.uint8
            )
            self._tensors: list[np.ndarray] = []
        else:
            self._frame = None
            self._tensors = [
                np.zeros(spec.concrete_shape(), spec.dtype) for spec in pool.info(MODEL).inputs
            ]

    def run_once(self) -> float:
        """One inference of the sample; its latency in ms.

        Raises:
            EdgeRuntimeError: the inference failed, timed out or its worker crashed.
        """
        t0 = time.perf_counter()
        if self._frame is not None:
            self.pool.infer(MODEL, frame=self._frame, timeout_s=self.timeout_s)
        else:
            self.pool.infer(MODEL, self._tensors, timeout_s=self.timeout_s)
        return (time.perf_counter() - t0) * 1000.0

    def close(self) -> None:
        self.pool.close()


def open_trial(bundle: Bundle, pool_config: PoolConfig, *, timeout_s: float) -> Trial:
    """Load ``bundle`` in a pool and warm it up with one run of the sample.

    Raises:
        InstallError: step "load" — no runnable model variant, the model does not load,
            the worker does not start, or the warm-up inference fails.
    """
    name = bundle.manifest.name
    pre = bundle.manifest.preprocess
    frame_bytes = pre.height * pre.width * pre.channels if pre is not None else 0
    try:
        cfg = bundle.model_config(MODEL, max_frame_bytes=max(frame_bytes, 1))
    except BundleError as exc:
        raise InstallError(Step.LOAD.value, exc.reason, name) from exc
    pool = WorkerPool([cfg], pool_config)
    try:
        pool.start()
        trial = Trial(bundle, pool, timeout_s)
        trial.run_once()
    except (EdgeRuntimeError, ValueError) as exc:
        pool.close()
        raise InstallError(Step.LOAD.value, f"load and warm-up: {exc}", name) from exc
    return trial


def self_benchmark(trial: Trial, *, runs: int) -> BenchResult:
    """``runs`` inferences of the sample; p95 over the bundle's latency budget refuses it.

    Raises:
        InstallError: step "benchmark" — an inference failed, or p95 > latency_budget_ms.
    """
    manifest = trial.bundle.manifest
    budget = manifest.latency_budget_ms
    times: list[float] = []
    try:
        times.extend(trial.run_once() for _ in range(max(1, runs)))
    except EdgeRuntimeError as exc:
        raise InstallError(
            Step.BENCHMARK.value, f"run {len(times) + 1} of {runs}: {exc}", manifest.name
        ) from exc
    arr = np.asarray(times)
    result = BenchResult(
        runs=len(times),
        p50_ms=float(np.percentile(arr, 50)),
        p95_ms=float(np.percentile(arr, 95)),
        max_ms=float(arr.max()),
        budget_ms=budget,
    )
    log.info(
        "%s %s: p50 %.2f ms, p95 %.2f ms over %d runs (budget %.2f ms)",
        manifest.name,
        manifest.version,
        result.p50_ms,
        result.p95_ms,
        result.runs,
        budget,
    )
    if result.p95_ms > budget:
        raise InstallError(
            Step.BENCHMARK.value,
            f"p95 latency {result.p95_ms:.3f} ms over {result.runs} runs is over the bundle's "
            f"latency budget of {budget:g} ms on this device",
            manifest.name,
        )
    return result


def measure_in_pool(
    bundle: Bundle, pool_config: PoolConfig, *, runs: int, timeout_s: float
) -> BenchResult:
    """:func:`open_trial` and :func:`self_benchmark` in a pool of its own, closed after.

    Raises:
        InstallError: step "load" or "benchmark".
    """
    trial = open_trial(bundle, pool_config, timeout_s=timeout_s)
    try:
        return self_benchmark(trial, runs=runs)
    finally:
        trial.close()


class PoolProbe:
    """The default health probe: every call runs the sample a few times in the trial's
    pool and returns counters since the probe was made (see :mod:`.health`)."""

    def __init__(self, trial: Trial, runs_per_call: int = 5) -> None:
        self.trial = trial
        self.runs_per_call = runs_per_call
        self.crashes = 0
        self.errors = 0
        self.times: list[float] = []
        self.runs = 0
        self._restarts0 = trial.pool.restarts()

    def __call__(self) -> dict[str, float]:
        for _ in range(self.runs_per_call):
            try:
                self.times.append(self.trial.run_once())
            except (WorkerCrashed, PoolClosed) as exc:
                log.warning("health probe: %s", exc)
                self.crashes += 1
            except EdgeRuntimeError as exc:
                log.warning("health probe: %s", exc)
                self.errors += 1
        restarts = self.trial.pool.restarts() - self._restarts0
        p95 = float(np.percentile(np.asarray(self.times), 95)) if self.times else 0.0
        self.runs += self.runs_per_call
        return {
            "worker_crashes": float(max(self.crashes, restarts)),
            "inference_errors": float(self.errors),
            "p95_ms": p95,
            "inferences": float(len(self.times)),
            "frames": float(self.runs),  # its inputs: the sample, run by the probe itself
        }
