"""The pool's worker processes: spawned pinned, watched, restarted within a budget.

Each worker is a ``spawn``ed process pinned to one core, talking over two pipes and
beating a heartbeat into a shared control segment; its log records come back through a
queue. The supervisor kills a worker that stops beating or is not ready in time, and
replaces a lost one unless the restart budget (so many restarts in a window) is spent,
in which case the pool is ``degraded``.

Every method except :meth:`Supervisor.start`, :meth:`Supervisor.join_all` and
:meth:`Supervisor.close` is called with the pool's lock held, from the I/O thread
(:mod:`runtime.dispatch`) or the caller of :meth:`runtime.pool.WorkerPool.close`.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeAlias

import numpy as np

from runtime._internal import protocol
from runtime._internal.shm import Segment
from runtime._internal.worker import WorkerModel, WorkerSpec, worker_main
from runtime.backends import BackendOptions
from runtime.backends.base import Array
from runtime.config import PoolConfig
from runtime.errors import EdgeRuntimeError, PoolClosed, WorkerCrashed
from runtime.metrics import ModelMetrics
from runtime.request import Request

log = logging.getLogger(__name__)

Finished: TypeAlias = list[tuple[Request, EdgeRuntimeError | None]]
"""Requests ended under the lock, with their error; finished outside it."""


class WorkerState(Enum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    DEAD = "dead"


@dataclass
class Worker:
    """One worker process and what the pool knows of it."""

    index: int
    core: int | None
    process: Any = None
    req_fd: int = -1
    resp_fd: int = -1
    sentinel: int = -1
    state: WorkerState = WorkerState.DEAD
    inflight: deque[list[Request]] = field(default_factory=deque)
    """Batches sent and not answered, oldest first: the one running, then (with
    pipelining) the one queued ahead in the worker's pipe."""
    started_ns: int = 0
    kill_reason: str = ""
    restarts: int = 0


class Supervisor:
    """Starts, watches and restarts the pool's workers.

    ``idle`` holds the workers ready for work, for the dispatcher to take from.
    ``ready`` is set once no worker is still starting; ``start_error`` then says why a
    worker could not start, if one could not.
    """

    def __init__(
        self, config: PoolConfig, options: BackendOptions, metrics: Sequence[ModelMetrics]
    ) -> None:
        self.config = config
        self._options = options
        self._metrics = metrics
        self._ctx = multiprocessing.get_context("spawn")
        self._models: tuple[WorkerModel, ...] = ()
        self.workers: list[Worker] = []
        self.idle: list[Worker] = []
        self._restart_times: deque[int] = deque()
        self._pending_restarts: list[Worker] = []
        self._control: Segment | None = None
        self._heartbeat: Array | None = None
        self._log_queue: Any = None
        self._log_listener: logging.handlers.QueueListener | None = None
        self.ready = threading.Event()
        self.start_error: str | None = None
        self.degraded: str | None = None
        self.stopping = False

    # -- starting ------------------------------------------------------------------
    def start(self, models: tuple[WorkerModel, ...], lock: threading.Lock) -> None:
        """Create the heartbeat segment and the log queue, then spawn every worker."""
        self._models = models
        n_workers = self.config.workers
        self._control = Segment.create("ctl", max(64, 8 * n_workers))
        self._heartbeat = self._control.array(0, (n_workers,), np.dtype(np.int64))
        self._log_queue = self._ctx.Queue()
        self._log_listener = logging.handlers.QueueListener(
            self._log_queue, _ForwardHandler(), respect_handler_level=False
        )
        self._log_listener.start()
        self.workers = [Worker(i, core) for i, core in enumerate(self.config.worker_cores())]
        with lock:
            for w in self.workers:
                self.spawn(w)

    def spawn(self, w: Worker) -> None:
        assert self._control is not None  # noqa: S101 - set in start()
        spec = WorkerSpec(
            index=w.index,
            core=w.core,
            options=self._options,
            models=self._models,
            control_path=str(self._control.path),
            control_size=self._control.size,
            heartbeat_interval_s=min(0.2, self.config.heartbeat_timeout_s / 4),
            nice=self.config.worker_nice,
            spin_ns=self.config.spin_us * 1000,
        )
        req_r, req_w = self._ctx.Pipe(duplex=False)
        resp_r, resp_w = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(
            target=_worker_entry,
            args=(spec, req_r, resp_w, self._log_queue),
            name=f"edgefleet-worker-{w.index}",
            daemon=True,
        )
        proc.start()
        req_r.close()
        resp_w.close()
        w.process = proc
        w.req_fd = os.dup(req_w.fileno())
        w.resp_fd = os.dup(resp_r.fileno())
        req_w.close()
        resp_r.close()
        w.sentinel = proc.sentinel
        w.state = WorkerState.STARTING
        w.started_ns = time.monotonic_ns()
        w.kill_reason = ""
        assert self._heartbeat is not None  # noqa: S101
        self._heartbeat[w.index] = w.started_ns

    def on_ready(self, w: Worker) -> None:
        """``w`` loaded its models and is warm."""
        self.make_idle(w)
        self._check_all_started()

    def on_load_failed(self, w: Worker, reason: str) -> None:
        log.error("worker %d could not load its models: %s", w.index, reason)
        if not self.ready.is_set():
            self.start_error = reason
        self.kill(w, f"load failed: {reason}")

    def make_idle(self, w: Worker) -> None:
        w.state = WorkerState.IDLE
        self.idle.append(w)

    def _check_all_started(self) -> None:
        if not self.ready.is_set() and all(
            w.state is not WorkerState.STARTING for w in self.workers
        ):
            self.ready.set()

    # -- watching ------------------------------------------------------------------
    def lost(self, w: Worker, detail: str, finished: Finished) -> None:
        """``w`` exited or its pipe broke: reap it, fail its requests, replace it."""
        if w.state is WorkerState.DEAD:
            return
        proc = w.process
        proc.join(timeout=1.0)
        if proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.join(timeout=1.0)
        code = proc.exitcode
        reason = w.kill_reason or detail or f"exited with code {code}"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                reason += f" ({signal.Signals(-code).name})"
        if w in self.idle:
            self.idle.remove(w)
        was_starting = w.state is WorkerState.STARTING
        w.state = WorkerState.DEAD
        if w.inflight:
            err = WorkerCrashed(w.index, reason)
            for batch in w.inflight:
                self._metrics[batch[0].model].count("crashed", len(batch))
                finished.extend((r, err) for r in batch)
            w.inflight.clear()
        if self.stopping:
            return
        log.warning("worker %d (pid %s) lost: %s", w.index, proc.pid, reason)
        if was_starting and not self.ready.is_set():
            self.start_error = self.start_error or reason
            self._check_all_started()
            return
        self._pending_restarts.append(w)
        self.restart_dead()

    def close_fds(self, w: Worker) -> None:
        for fd in (w.req_fd, w.resp_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        w.req_fd = w.resp_fd = -1
        with contextlib.suppress(Exception):
            w.process.close()

    def restart_dead(self) -> None:
        """Respawn lost workers whose pipes are closed, while the restart budget lasts."""
        if not self._pending_restarts:
            return
        now = time.monotonic_ns()
        window = int(self.config.restart_window_s * 1e9)
        while self._restart_times and now - self._restart_times[0] > window:
            self._restart_times.popleft()
        while self._pending_restarts:
            w = self._pending_restarts[0]
            if w.resp_fd != -1:
                return  # fds not closed yet; next sweep
            if len(self._restart_times) >= self.config.restart_budget:
                self.degraded = (
                    f"restart budget spent ({self.config.restart_budget} restarts in "
                    f"{self.config.restart_window_s:g} s); worker {w.index} stays down"
                )
                log.error("%s", self.degraded)
                self._pending_restarts.clear()
                return
            self._pending_restarts.pop(0)
            self._restart_times.append(now)
            w.restarts += 1
            log.warning("restarting worker %d", w.index)
            self.spawn(w)

    def check_heartbeats(self) -> None:
        """Kill a worker silent past the heartbeat timeout, or not ready in time."""
        assert self._heartbeat is not None  # noqa: S101
        now = time.monotonic_ns()
        limit = int(self.config.heartbeat_timeout_s * 1e9)
        start_limit = int(self.config.start_timeout_s * 1e9)
        for w in self.workers:
            if w.state in (WorkerState.IDLE, WorkerState.BUSY):
                silent = now - int(self._heartbeat[w.index])
                if silent > limit and not w.kill_reason:
                    self.kill(w, f"stopped heart-beating for {silent / 1e9:.2f} s")
            elif w.state is WorkerState.STARTING and now - w.started_ns > start_limit:
                self.kill(w, f"not ready after {self.config.start_timeout_s:g} s")

    def kill(self, w: Worker, reason: str) -> None:
        w.kill_reason = reason
        log.warning("killing worker %d: %s", w.index, reason)
        with contextlib.suppress(ProcessLookupError, AttributeError, TypeError):
            os.kill(w.process.pid, signal.SIGKILL)

    def all_dead(self) -> bool:
        """The restart budget is spent and no worker is left."""
        return self.degraded is not None and not any(
            w.state is not WorkerState.DEAD for w in self.workers
        )

    # -- status ----------------------------------------------------------------------
    def pids(self) -> list[int | None]:
        return [
            w.process.pid if w.state is not WorkerState.DEAD and w.process else None
            for w in self.workers
        ]

    def ready_count(self) -> int:
        return sum(w.state in (WorkerState.IDLE, WorkerState.BUSY) for w in self.workers)

    def restarts(self) -> int:
        return sum(w.restarts for w in self.workers)

    # -- stopping --------------------------------------------------------------------
    def send_stop(self) -> None:
        """Ask every live worker to exit; a worker lost from now on is not replaced."""
        self.stopping = True
        for w in self.workers:
            if w.state is not WorkerState.DEAD and w.req_fd != -1:
                with contextlib.suppress(OSError):
                    protocol.write_all(w.req_fd, protocol.pack_stop())

    def join_all(self, timeout_s: float, finished: Finished) -> None:
        """Wait for the workers to exit (killing the late ones), failing what they held.
        Call once the I/O thread has stopped."""
        deadline = time.monotonic() + timeout_s
        for w in self.workers:
            if w.process is None:
                continue
            with contextlib.suppress(ValueError):
                w.process.join(max(0.0, deadline - time.monotonic()))
                if w.process.is_alive():
                    w.process.kill()
                    w.process.join(1.0)
            for batch in w.inflight:
                finished.extend((r, PoolClosed()) for r in batch)
            w.inflight.clear()
            w.state = WorkerState.DEAD
            self.close_fds(w)
        self.idle.clear()

    def close(self) -> None:
        """Stop forwarding logs and free the heartbeat segment."""
        if self._log_listener is not None:
            self._log_listener.stop()
            self._log_listener = None
        if self._log_queue is not None:
            self._log_queue.close()
            self._log_queue.join_thread()
            self._log_queue = None
        self._heartbeat = None
        if self._control is not None:
            self._control.close()
            self._control = None


class _ForwardHandler(logging.Handler):
    """Hands a worker's log record to this process's logger of the same name."""

    def emit(self, record: logging.LogRecord) -> None:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)


def _worker_entry(spec: WorkerSpec, req_conn: Any, resp_conn: Any, log_queue: Any) -> None:
    worker_main(spec, req_conn.fileno(), resp_conn.fileno(), log_queue)
