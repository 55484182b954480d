"""The ``inline`` execution mode: the thread that submits runs the session itself.

For a device with one camera per core, the hop to a worker process (a pipe write, a
worker's wake-up, the answer read by the pool's I/O thread, the caller's wake-up) is
pure cost: ONNX Runtime and LiteRT release the GIL while they run, so a pipeline thread
pinned to a core of its own can run its model directly, as fast as the bare runtime.

:class:`InlineLanes` plays both parts the pool's facade wires together in ``pool``
mode, the dispatcher (the :class:`runtime.request.SlotPool` requests talk to) and the
supervisor (start, status, close), so :class:`runtime.pool.WorkerPool` keeps one
interface. There are ``workers`` lanes, each a set of warm sessions and a core. A
thread takes a lane the first time it submits (the lane with the fewest threads) and is
pinned to the lane's core; threads that share a lane take turns under its lock, and
that wait is the ``queue_wait`` stage. Inputs still go through the model's
shared-memory slots, so requests, reservations and outputs read the same in both modes.

What inline mode gives up: a crash in a session takes the whole process (no worker to
lose and replace); priorities only order nothing (a lane runs its threads' requests as
they come); dynamic batching runs requests one by one; a deadline is checked once,
when the lane is free.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence

from runtime._internal import protocol
from runtime._internal.shm import SlotViews
from runtime._internal.worker import WorkerModel, _Model
from runtime.backends import BackendOptions
from runtime.config import PoolConfig
from runtime.errors import (
    DeadlineExceeded,
    EdgeRuntimeError,
    InferenceFailed,
    Overloaded,
    PoolClosed,
)
from runtime.metrics import ModelMetrics
from runtime.request import Request, SlotReturns

log = logging.getLogger(__name__)


class _Lane:
    """Warm sessions of every model, a core, and the lock threads sharing it take."""

    def __init__(self, index: int, core: int | None) -> None:
        self.index = index
        self.core = core
        self.lock = threading.Lock()
        self.models: list[_Model] = []
        self.threads = 0


class InlineLanes(SlotReturns):
    """Runs requests on the submitting thread, one lane of sessions per core.

    ``lock`` guards the free slots and counts (never held while a model runs).
    """

    def __init__(
        self,
        names: Sequence[str],
        queue_bounds: Sequence[int],
        metrics: Sequence[ModelMetrics],
        config: PoolConfig,
        options: BackendOptions,
    ) -> None:
        self._names = list(names)
        self._bounds = list(queue_bounds)
        self._metrics = metrics
        self.config = config
        self._options = options
        self.lock = threading.Lock()
        self._views: list[SlotViews] = []
        self._free: list[list[int]] = []
        self._outstanding = [0] * len(self._names)
        self._lanes: list[_Lane] = []
        self._local = threading.local()
        self.closed = True
        self.ready = threading.Event()
        self.start_error: str | None = None
        self.degraded: str | None = None

    # -- the dispatcher's part -----------------------------------------------------
    def open(self, views: Sequence[SlotViews]) -> None:
        self._views = list(views)
        self._free = [list(range(v.layout.n_slots - 1, -1, -1)) for v in views]
        self.closed = False

    def start_thread(self) -> None:
        """Nothing to start: the callers' threads do the work."""

    def model_name(self, model: int) -> str:
        return self._names[model]

    def views(self, model: int) -> SlotViews:
        return self._views[model]

    def reserve(self, model: int) -> int:
        """Hold a slot of ``model``.

        Raises:
            Overloaded: more requests of the model are waiting for a lane than its
                queue bound.
            PoolClosed: the pool is closed.
        """
        with self.lock:
            if self.closed:
                raise PoolClosed()
            limit = self._bounds[model] + len(self._lanes)
            if not self._free[model] or self._outstanding[model] >= limit:
                self._metrics[model].count("refused")
                raise Overloaded(self._names[model], self._bounds[model])
            self._outstanding[model] += 1
            return self._free[model].pop()

    def enqueue(self, request: Request) -> None:
        """Run ``request`` now, on this thread's lane, and finish it."""
        now = time.perf_counter_ns()
        request.t_enqueue_ns = now
        model = request.model
        metrics = self._metrics[model]
        metrics.count("submitted")
        error: EdgeRuntimeError | None = None
        if self.closed:
            error = PoolClosed()
        else:
            lane = self._lane()
            with lane.lock:
                t_start = time.perf_counter_ns()
                request.t_dispatch_ns = t_start
                if request.deadline_ns is not None and request.deadline_ns <= t_start:
                    metrics.count("expired")
                    error = DeadlineExceeded(
                        self._names[model], (t_start - request.deadline_ns) / 1e6
                    )
                elif not lane.models:
                    error = PoolClosed()
                else:
                    try:
                        t_pre, t_done = lane.models[model].run(
                            [protocol.SlotRef(request.slot, request.frame_shape)]
                        )
                    except Exception as exc:  # reported to the caller as InferenceFailed
                        log.debug("inference failed", exc_info=True)
                        metrics.count("failed")
                        error = InferenceFailed(self._names[model], f"{type(exc).__name__}: {exc}")
            if error is None:
                request.t_complete_ns = t_done
                metrics.record_many(
                    [
                        ("submit", now - request.t_submit_ns),
                        ("queue_wait", t_start - now),
                        ("preprocess", t_pre - t_start),
                        ("inference", t_done - t_pre),
                    ]
                )
                metrics.count("completed")
        with self.lock:
            self._outstanding[model] -= 1
            if error is not None:
                request.mark_released()
                self._free[model].append(request.slot)
        request.finish(error)
        if request.abandoned and error is None:
            request.release()

    def cancel(self, request: Request) -> None:
        with self.lock:
            self._outstanding[request.model] -= 1
            self._free[request.model].append(request.slot)

    def queued(self, model: int) -> int:
        """Requests of ``model`` reserved or waiting for a lane, not yet run."""
        with self.lock:
            return max(0, self._outstanding[model])

    def busy(self) -> bool:
        """Whether a new request would wait: any request of any model is reserved,
        waiting for a lane or running."""
        with self.lock:
            return any(n > 0 for n in self._outstanding)

    def _lane(self) -> _Lane:
        """This thread's lane: taken (and the thread pinned) on its first request."""
        lane: _Lane | None = getattr(self._local, "lane", None)
        if lane is not None:
            return lane
        with self.lock:
            lane = min(self._lanes, key=lambda ln: (ln.threads, ln.index))
            lane.threads += 1
        if lane.core is not None and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(0, {lane.core})  # this thread only
            except OSError as exc:
                log.warning("could not pin thread to core %d: %s", lane.core, exc)
        self._local.lane = lane
        return lane

    # -- the supervisor's part -----------------------------------------------------
    def start(self, models: tuple[WorkerModel, ...], lock: threading.Lock) -> None:
        """Load and warm every model once per lane."""
        try:
            for i, core in enumerate(self.config.worker_cores()):
                lane = _Lane(i, core)
                lane.models = [_Model(m, self._options) for m in models]
                self._lanes.append(lane)
        except Exception as exc:  # as a worker reports LOAD_FAILED
            log.exception("inline lane could not load its models")
            self.start_error = str(exc)
        self.ready.set()

    def pids(self) -> list[int | None]:
        """No worker processes: the sessions run in this one."""
        return []

    def ready_count(self) -> int:
        return len(self._lanes)

    def restarts(self) -> int:
        return 0

    def close_lanes(self, timeout_s: float) -> bool:
        """Stop taking requests, wait for the running ones, close the sessions. False
        when already closed."""
        with self.lock:
            if self.closed and not self._lanes:
                return False
            self.closed = True
        deadline = time.monotonic() + timeout_s
        for lane in self._lanes:
            got = lane.lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
            try:
                for m in lane.models:
                    with contextlib.suppress(Exception):
                        m.close()
                lane.models = []
            finally:
                if got:
                    lane.lock.release()
        self._lanes.clear()
        self._views.clear()
        return True
