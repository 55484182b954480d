"""What a worker pool is built from: the models it serves and how it runs them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from runtime.preprocess import PreprocessSpec

if TYPE_CHECKING:
    from runtime.profiles import Profile

ExecutionMode = Literal["pool", "inline"]
EXECUTION_MODES: tuple[ExecutionMode, ...] = ("pool", "inline")


@dataclass(frozen=True)
class BatchConfig:
    """Dynamic batching for a model with a batch dimension (off when max_batch is 1).

    A worker takes up to ``max_batch`` queued requests of the model at once; with fewer
    queued it waits until the oldest has waited ``max_wait_us``.
    """

    max_batch: int = 1
    max_wait_us: int = 0


@dataclass(frozen=True)
class ModelConfig:
    """One model the pool serves.

    Attributes:
        name: the name requests use.
        path: the model file (.onnx or .tflite).
        backend: "onnx" or "litert"; detected from the file when ``None``.
        input_shapes: shapes for inputs with dynamic dimensions, by input name; a
            dynamic leading (batch) dimension defaults to 1.
        preprocess: how raw frames become the first input; ``None``: callers pass
            tensors.
        max_frame_bytes: capacity of each slot's raw-frame area (with ``preprocess``).
        queue_bound: requests that may wait for a worker; more are refused at once.
        batching: dynamic batching, off by default.
    """

    name: str
    path: str
    backend: str | None = None
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    preprocess: PreprocessSpec | None = None
    max_frame_bytes: int = 1920 * 1080 * 3
    queue_bound: int = 8
    batching: BatchConfig = field(default_factory=BatchConfig)


@dataclass(frozen=True)
class PoolConfig:
    """How the pool runs: workers, pinning, sessions, fault handling.

    Attributes:
        workers: number of worker processes.
        cores: cores to pin workers to, worker i on ``cores[i % len(cores)]``;
            ``None``: the cores this process may run on.
        pin: pin workers at all (off only for experiments).
        execution_mode: ``"pool"``: worker processes behind shared-memory slots (a
            crash costs a worker, not the caller); ``"inline"``: the thread that submits
            runs the session itself, pinned to a core of its own (no process hop; for
            one camera per core). ADR 0007 has the measurements behind each default.
        pipelining: keep one request queued ahead at each busy worker, so a loaded
            worker starts its next request without waiting a round trip.
        spin_us: how long a worker spins (yielding its core) for its next request
            before it blocks on its pipe; 0: block at once. Bounded spin keeps an idle
            worker's core awake, so the next request does not pay a sleeping core's
            wake-up.
        threads_per_worker: intra-op threads of each session.
        providers: ONNX Runtime execution providers in order of preference.
        delegates: LiteRT delegates in order of preference (gpu, xnnpack, edgetpu).
        spin_wait: let idle intra-op threads spin (off unless measured to help).
        heartbeat_timeout_s: a worker silent this long is killed and replaced.
        restart_budget: at most this many restarts within ``restart_window_s``; past
            that a dead worker stays down and the pool reports itself degraded.
        start_timeout_s: how long a worker may take to load and warm up its models.
        extra_slots: slots per model beyond queue and in-flight needs, for results
            that callers still hold; ``None``: one per worker.
        worker_nice: niceness added to worker processes. Workers are pinned and
            compute-bound; a positive value lets the pool's own I/O thread (which
            completes requests and dispatches the next) preempt them at once instead
            of waiting out the scheduler's time slice, which bounds the latency tail.
        io_thread_rt_priority: SCHED_RR priority for the pool's I/O thread (0: none).
            It needs CAP_SYS_NICE; without it the thread stays at normal priority.
    """

    workers: int = 1
    cores: tuple[int, ...] | None = None
    pin: bool = True
    execution_mode: ExecutionMode = "pool"
    pipelining: bool = True
    spin_us: int = 0
    threads_per_worker: int = 1
    providers: tuple[str, ...] = ()
    delegates: tuple[str, ...] = ()
    spin_wait: bool = False
    heartbeat_timeout_s: float = 1.0
    restart_budget: int = 5
    restart_window_s: float = 60.0
    start_timeout_s: float = 60.0
    extra_slots: int | None = None
    worker_nice: int = 5
    io_thread_rt_priority: int = 1

    def __post_init__(self) -> None:
        if self.execution_mode not in EXECUTION_MODES:
            raise ValueError(
                f"execution_mode must be one of {', '.join(EXECUTION_MODES)}, "
                f"got {self.execution_mode!r}"
            )
        if self.spin_us < 0:
            raise ValueError(f"spin_us must be >= 0, got {self.spin_us}")

    def worker_cores(self) -> list[int | None]:
        """The core each worker is pinned to (``None``: not pinned)."""
        if not self.pin or not hasattr(os, "sched_getaffinity"):
            return [None] * self.workers
        cores = list(self.cores) if self.cores else sorted(os.sched_getaffinity(0))
        return [cores[i % len(cores)] for i in range(self.workers)]

    @classmethod
    def from_profile(cls, profile: Profile, **overrides: object) -> PoolConfig:
        """Build from a firmware profile; keyword arguments override its values."""
        cores = profile.resolve_cores()
        values: dict[str, object] = {
            "workers": profile.resolve_workers(),
            "cores": tuple(cores),
            "threads_per_worker": profile.threads_per_worker,
            "providers": tuple(profile.execution_providers),
            "delegates": tuple(profile.tflite_delegates),
            "execution_mode": profile.execution_mode,
            "pipelining": profile.pipelining,
            "spin_us": profile.handoff_spin_us,
            "spin_wait": profile.spin_wait,
            "heartbeat_timeout_s": profile.heartbeat_timeout_s,
        }
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]
