"""The worker pool: pinned worker processes, shared-memory slots, one I/O thread.

Callers reserve a slot (refused at once when the model's queue is full), put the input
in it (or a raw frame the worker preprocesses), and submit. Only the slot index travels
to a worker, over a pipe; the worker runs the model reading from and writing to shared
memory, and answers with its timings. One I/O thread in this process reads the
answers, watches workers (exit and heartbeat), expires queued requests past their
deadline, and hands the next work to a worker the moment it is free.

The scheduling rules live in :mod:`runtime.scheduler` (pure); this module is the shell.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import multiprocessing
import os
import select
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from runtime._internal import protocol
from runtime._internal.shm import Segment, SlotLayout, SlotViews
from runtime._internal.worker import WorkerModel, WorkerSpec, worker_main
from runtime.backends import BackendOptions, TensorSpec, detect_backend, open_model
from runtime.backends.base import Array
from runtime.config import ModelConfig, PoolConfig
from runtime.errors import (
    DeadlineExceeded,
    EdgeRuntimeError,
    InferenceFailed,
    InputDtypeError,
    InputShapeError,
    InputTooLarge,
    ModelLoadError,
    Overloaded,
    PoolClosed,
    WorkerCrashed,
)
from runtime.metrics import ModelMetrics
from runtime.preprocess import model_hw
from runtime.request import Request, Reservation
from runtime.scheduler import Priority, QueuePolicy, Scheduler, Ticket

log = logging.getLogger(__name__)

_SWEEP_NS = 20_000_000  # heartbeat and deadline checks at least this often


@dataclass(frozen=True)
class ModelInfo:
    """A served model as read from its file."""

    name: str
    path: str
    backend: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    providers: tuple[str, ...]


class _State(Enum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    DEAD = "dead"


@dataclass
class _Worker:
    index: int
    core: int | None
    process: Any = None
    req_fd: int = -1
    resp_fd: int = -1
    sentinel: int = -1
    state: _State = _State.DEAD
    inflight: list[Request] = field(default_factory=list)
    started_ns: int = 0
    kill_reason: str = ""
    restarts: int = 0


class WorkerPool:
    """N pinned worker processes serving a set of models through shared memory.

    Raises (constructor):
        ModelLoadError: a model file is corrupt, of the wrong format, needs unsupported
            operators, or has dynamic input dimensions with no shape given.
        BackendUnavailable: a model's backend can't be imported on this device.
    """

    def __init__(self, models: Sequence[ModelConfig], config: PoolConfig | None = None) -> None:
        self.config = config or PoolConfig()
        if self.config.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.config.workers}")
        if not models:
            raise ValueError("a pool needs at least one model")
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        self._configs = list(models)
        self._options = BackendOptions(
            threads=self.config.threads_per_worker,
            providers=self.config.providers,
            spin_wait=self.config.spin_wait,
        )
        # Probe every model here, before any worker exists: a bad file fails now,
        # naming the file, and the probe tells us the tensor shapes to allocate.
        self.models: list[ModelInfo] = [self._probe(m) for m in self._configs]
        self._index = {m.name: i for i, m in enumerate(self.models)}
        self.metrics = {m.name: ModelMetrics() for m in self.models}
        self._metrics_list = [self.metrics[m.name] for m in self.models]
        self._lock = threading.Lock()
        self._scheduler = Scheduler(
            [
                QueuePolicy(
                    c.queue_bound,
                    c.batching.max_batch,
                    c.batching.max_wait_us * 1000,
                )
                for c in self._configs
            ]
        )
        self._segments: list[Segment] = []
        self._views: list[SlotViews] = []
        self._layouts: list[SlotLayout] = []
        self._free: list[list[int]] = []
        self._workers: list[_Worker] = []
        self._idle: list[_Worker] = []
        self._restart_times: deque[int] = deque()
        self._pending_restarts: list[_Worker] = []
        self._closed = True
        self._started = False
        self._ctx = multiprocessing.get_context("spawn")
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1
        self._control: Segment | None = None
        self._heartbeat: Array | None = None
        self._log_queue: Any = None
        self._log_listener: logging.handlers.QueueListener | None = None
        self._ready = threading.Event()
        self._start_error: str | None = None
        self.degraded: str | None = None

    # -- set-up ------------------------------------------------------------------
    def _probe(self, cfg: ModelConfig) -> ModelInfo:
        key = cfg.backend or detect_backend(cfg.path)
        probe_options = BackendOptions(threads=1, providers=self._options.providers)
        backend = open_model(cfg.path, probe_options, key)
        try:
            shapes: dict[str, tuple[int, ...]] = {}
            for spec in backend.inputs:
                given = cfg.input_shapes.get(spec.name)
                if given is not None:
                    shapes[spec.name] = tuple(given)
                    continue
                dims = list(spec.shape)
                if dims and dims[0] is None:
                    dims[0] = 1
                if any(d is None for d in dims):
                    raise ModelLoadError(
                        cfg.path,
                        f"input '{spec.name}' has dynamic dimensions {spec.shape}; "
                        "give its shape (input_shapes / --input-shape)",
                    )
                shapes[spec.name] = tuple(int(d) for d in dims if d is not None)
            backend.prepare(shapes)
            if cfg.batching.max_batch > 1:
                if cfg.batching.max_batch > protocol.MAX_BATCH:
                    raise ValueError(f"max_batch is at most {protocol.MAX_BATCH}")
                variant = backend.batch_variant(cfg.batching.max_batch)
                variant.run(
                    [
                        np.zeros((cfg.batching.max_batch, *s.concrete_shape()[1:]), s.dtype)
                        for s in backend.inputs
                    ]
                )
            if cfg.preprocess is not None:
                first = backend.inputs[0]
                try:
                    model_hw(cfg.preprocess, first.concrete_shape())
                except ValueError as exc:
                    raise ModelLoadError(cfg.path, f"preprocess: {exc}") from exc
            return ModelInfo(
                cfg.name,
                cfg.path,
                key,
                tuple(backend.inputs),
                tuple(backend.outputs),
                tuple(backend.active_providers),
            )
        finally:
            backend.close()

    def start(self) -> WorkerPool:
        """Allocate slots, start the workers and wait until every one is warm.

        Raises:
            EdgeRuntimeError: a worker could not load its models in time.
        """
        if self._started:
            raise RuntimeError("pool already started")
        self._started = True
        n_workers = self.config.workers
        for i, (cfg, info) in enumerate(zip(self._configs, self.models, strict=True)):
            extra = self.config.extra_slots if self.config.extra_slots is not None else n_workers
            n_slots = cfg.queue_bound + n_workers * cfg.batching.max_batch + extra
            frame_bytes = cfg.max_frame_bytes if cfg.preprocess is not None else 0
            layout = SlotLayout.build(
                n_slots,
                frame_bytes,
                [(s.concrete_shape(), s.dtype.str) for s in info.inputs],
                [(s.concrete_shape(), s.dtype.str) for s in info.outputs],
            )
            seg = Segment.create(f"m{i}", layout.total_bytes)
            self._segments.append(seg)
            self._layouts.append(layout)
            self._views.append(SlotViews(seg, layout))
            self._free.append(list(range(n_slots - 1, -1, -1)))
        self._control = Segment.create("ctl", max(64, 8 * n_workers))
        self._heartbeat = self._control.array(0, (n_workers,), np.dtype(np.int64))
        self._log_queue = self._ctx.Queue()
        self._log_listener = logging.handlers.QueueListener(
            self._log_queue, _ForwardHandler(), respect_handler_level=False
        )
        self._log_listener.start()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._closed = False
        self._workers = [_Worker(i, core) for i, core in enumerate(self.config.worker_cores())]
        with self._lock:
            for w in self._workers:
                self._spawn(w)
        self._thread = threading.Thread(target=self._loop, name="edgefleet-pool-io", daemon=True)
        self._thread.start()
        if not self._ready.wait(self.config.start_timeout_s + 5):
            self.close()
            raise EdgeRuntimeError("workers did not become ready in time")
        if self._start_error is not None:
            err = self._start_error
            self.close()
            raise EdgeRuntimeError(f"a worker could not start: {err}")
        return self

    def _spawn(self, w: _Worker) -> None:
        assert self._control is not None  # noqa: S101 - set in start()
        spec = WorkerSpec(
            index=w.index,
            core=w.core,
            options=self._options,
            models=tuple(
                WorkerModel(
                    name=info.name,
                    path=info.path,
                    backend=info.backend,
                    input_shapes={s.name: s.concrete_shape() for s in info.inputs},
                    layout=self._layouts[i],
                    segment_path=str(self._segments[i].path),
                    preprocess=cfg.preprocess,
                    max_batch=cfg.batching.max_batch,
                )
                for i, (cfg, info) in enumerate(zip(self._configs, self.models, strict=True))
            ),
            control_path=str(self._control.path),
            control_size=self._control.size,
            heartbeat_interval_s=min(0.2, self.config.heartbeat_timeout_s / 4),
            nice=self.config.worker_nice,
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
        w.state = _State.STARTING
        w.started_ns = time.monotonic_ns()
        w.kill_reason = ""
        assert self._heartbeat is not None  # noqa: S101
        self._heartbeat[w.index] = w.started_ns

    # -- submitting --------------------------------------------------------------
    def info(self, model: str) -> ModelInfo:
        return self.models[self._model_index(model)]

    def _model_index(self, model: str) -> int:
        try:
            return self._index[model]
        except KeyError:
            raise KeyError(f"unknown model '{model}' (served: {', '.join(self._index)})") from None

    def reserve(
        self,
        model: str,
        *,
        priority: Priority = Priority.CONTROL,
        deadline_s: float | None = None,
        t0_ns: int | None = None,
        callback: Callable[[Request], None] | None = None,
    ) -> Reservation:
        """Hold a queue place and a slot for ``model``.

        ``t0_ns`` is when the work began (a frame's capture time, a load generator's
        intended send time; ``time.perf_counter_ns`` clock); total latency counts
        from it. ``deadline_s`` counts from now.

        Raises:
            Overloaded: the model's queue is full; refused at once.
            PoolClosed: the pool is closed or has no worker left.
        """
        mi = self._model_index(model)
        now = time.perf_counter_ns()
        with self._lock:
            if self._closed:
                raise PoolClosed()
            if self.degraded is not None and not any(
                w.state is not _State.DEAD for w in self._workers
            ):
                raise PoolClosed(f"no worker left: {self.degraded}")
            if not self._free[mi] or not self._scheduler.reserve(mi):
                self._metrics_list[mi].count("refused")
                raise Overloaded(self.models[mi].name, self._configs[mi].queue_bound)
            slot = self._free[mi].pop()
        deadline = now + int(deadline_s * 1e9) if deadline_s is not None else None
        req = Request(self, mi, slot, priority, t0_ns or now, deadline, callback)
        req.t_submit_ns = now
        return Reservation(self, req)

    def submit(
        self,
        model: str,
        inputs: Array | Sequence[Array] | None = None,
        *,
        frame: Array | None = None,
        priority: Priority = Priority.CONTROL,
        deadline_s: float | None = None,
        t0_ns: int | None = None,
        callback: Callable[[Request], None] | None = None,
    ) -> Request:
        """Submit one request with its input tensor(s), or a raw uint8 frame (H, W, C)
        that the worker preprocesses into the input.

        Raises:
            InputShapeError, InputDtypeError, InputTooLarge: the input doesn't fit;
                checked before any copy.
            Overloaded: the model's queue is full; refused at once.
            PoolClosed: the pool is closed.
        """
        mi = self._model_index(model)
        if frame is not None:
            self._check_frame(mi, frame)
        else:
            if inputs is None:
                raise ValueError("submit needs inputs or a frame")
            arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            self._check_tensors(mi, arrays)
        res = self.reserve(
            model, priority=priority, deadline_s=deadline_s, t0_ns=t0_ns, callback=callback
        )
        try:
            if frame is not None:
                h, w = frame.shape[:2]
                c = frame.shape[2] if frame.ndim == 3 else 1
                np.copyto(res.frame(h, w, c), frame.reshape(h, w, c))
            else:
                for dst, src in zip(res.inputs, arrays, strict=True):
                    np.copyto(dst, src)
        except BaseException:
            res.cancel()
            raise
        return res.submit()

    def infer(
        self,
        model: str,
        inputs: Array | Sequence[Array] | None = None,
        *,
        frame: Array | None = None,
        priority: Priority = Priority.CONTROL,
        deadline_s: float | None = None,
        timeout_s: float = 10.0,
    ) -> list[Array]:
        """Submit, wait, and return copies of the outputs (the simple, synchronous way).

        Raises: as :meth:`submit` and :meth:`Request.wait`.
        """
        req = self.submit(model, inputs, frame=frame, priority=priority, deadline_s=deadline_s)
        with req.wait(timeout_s):
            return [o.copy() for o in req.outputs]

    def _check_tensors(self, mi: int, arrays: list[Array]) -> None:
        info = self.models[mi]
        if len(arrays) != len(info.inputs):
            raise InputShapeError(info.name, (len(info.inputs),), (len(arrays),))
        for spec, arr in zip(info.inputs, arrays, strict=True):
            # dtype first: a float64 array of the right shape is a dtype error, though
            # it is also twice the slot's size.
            if arr.dtype != spec.dtype:
                raise InputDtypeError(info.name, str(spec.dtype), str(arr.dtype))
            if arr.nbytes > spec.nbytes:
                raise InputTooLarge(info.name, spec.nbytes, arr.nbytes)
            if tuple(arr.shape) != spec.concrete_shape():
                raise InputShapeError(info.name, spec.concrete_shape(), arr.shape)

    def _check_frame(self, mi: int, frame: Array) -> None:
        info = self.models[mi]
        cfg = self._configs[mi]
        if cfg.preprocess is None:
            raise ValueError(f"model '{info.name}' has no preprocessing; pass a tensor")
        if frame.nbytes > cfg.max_frame_bytes:
            raise InputTooLarge(info.name, cfg.max_frame_bytes, frame.nbytes)
        if frame.dtype != np.uint8:
            raise InputDtypeError(info.name, "uint8", str(frame.dtype))
        if frame.ndim not in (2, 3) or (frame.ndim == 3 and frame.shape[2] not in (1, 3)):
            raise InputShapeError(info.name, (-1, -1, 3), frame.shape)

    # -- the shell around the scheduler -----------------------------------------
    def _enqueue(self, req: Request) -> None:
        ticket = Ticket(req.model, req.priority, time.perf_counter_ns(), req.deadline_ns, req)
        finished: list[tuple[Request, EdgeRuntimeError | None]] = []
        with self._lock:
            if self._closed:
                self._scheduler.unreserve(req.model)
                finished.append((req, PoolClosed()))
            else:
                self._metrics_list[req.model].count("submitted")
                self._scheduler.enqueue(ticket)
                self._dispatch(ticket.enqueued_ns, finished)
                if self._configs[req.model].batching.max_batch > 1:
                    self._wake()
        self._complete(finished)

    def _cancel(self, req: Request) -> None:
        with self._lock:
            self._scheduler.unreserve(req.model)
            self._free[req.model].append(req.slot)

    def _release(self, req: Request) -> None:
        if req.error is None and req.t_complete_ns:
            now = time.perf_counter_ns()
            self._metrics_list[req.model].record_many(
                [("postprocess", now - req.t_complete_ns), ("total", now - req.t0_ns)]
            )
        with self._lock:
            self._free[req.model].append(req.slot)

    def _abandon(self, req: Request) -> None:
        with self._lock:
            req.abandoned = True
            done = req.done()
        if done:
            req.release()

    def _dispatch(self, now: int, finished: list[tuple[Request, EdgeRuntimeError | None]]) -> None:
        """Give queued work to idle workers. Called with the lock held."""
        while self._idle:
            batch, expired = self._scheduler.next_batch(now)
            finished.extend((t.payload, self._expired_error(t, now)) for t in expired)
            if not batch:
                return
            reqs: list[Request] = [t.payload for t in batch]
            msg = protocol.pack_run(
                batch[0].model, [protocol.SlotRef(r.slot, r.frame_shape) for r in reqs]
            )
            worker = self._idle.pop()  # only once the message is built: nothing can lose it
            worker.state = _State.BUSY
            worker.inflight = reqs
            sent_ns = time.perf_counter_ns()
            for r in reqs:
                r.t_dispatch_ns = sent_ns
            try:
                protocol.write_all(worker.req_fd, msg)
            except OSError as exc:
                self._worker_lost(worker, f"request pipe failed: {exc}", finished)

    def _expired_error(self, t: Ticket, now: int) -> EdgeRuntimeError:
        self._metrics_list[t.model].count("expired")
        late = (now - (t.deadline_ns or now)) / 1e6
        return DeadlineExceeded(self.models[t.model].name, late)

    def _complete(self, finished: list[tuple[Request, EdgeRuntimeError | None]]) -> None:
        """Finish requests outside the lock (callbacks may submit more work)."""
        for req, error in finished:
            if error is not None:
                if not isinstance(error, (DeadlineExceeded,)):
                    self._metrics_list[req.model].count("failed")
                req._released = True
                with self._lock:
                    self._free[req.model].append(req.slot)
            req._finish(error)
            if req.abandoned and error is None:
                req.release()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    # -- the I/O thread -------------------------------------------------------------
    def _loop(self) -> None:
        _raise_io_thread_priority(self.config.io_thread_rt_priority)
        ep = select.epoll()
        ep.register(self._wake_r, select.EPOLLIN)
        registered: dict[int, tuple[str, _Worker]] = {}
        last_sweep = 0
        while True:
            with self._lock:
                if self._closed:
                    break
                for w in self._workers:
                    if w.state is not _State.DEAD and w.resp_fd not in registered:
                        ep.register(w.resp_fd, select.EPOLLIN)
                        ep.register(w.sentinel, select.EPOLLIN)
                        registered[w.resp_fd] = ("resp", w)
                        registered[w.sentinel] = ("exit", w)
                wake = self._scheduler.next_wakeup(time.perf_counter_ns())
            timeout_ns = _SWEEP_NS
            if wake is not None:
                timeout_ns = max(0, min(timeout_ns, wake - time.perf_counter_ns()))
            events = ep.poll(timeout_ns / 1e9)
            finished: list[tuple[Request, EdgeRuntimeError | None]] = []
            with self._lock:
                for fd, _ev in events:
                    if fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                        continue
                    entry = registered.get(fd)
                    if entry is None:
                        continue
                    kind, w = entry
                    if kind == "resp":
                        self._on_response(w, finished)
                    else:
                        self._worker_lost(w, "", finished)
                    if w.state is _State.DEAD:
                        for gone in (w.resp_fd, w.sentinel):
                            if registered.pop(gone, None) is not None:
                                with contextlib.suppress(OSError, ValueError):
                                    ep.unregister(gone)
                        self._close_worker_fds(w)
                now = time.perf_counter_ns()
                if now - last_sweep >= _SWEEP_NS:
                    last_sweep = now
                    self._check_heartbeats()
                    self._restart_dead()
                    finished.extend(
                        (t.payload, self._expired_error(t, now))
                        for t in self._scheduler.expire(now)
                    )
                    self._fail_all_if_no_workers(finished)
                self._dispatch(now, finished)
            self._complete(finished)
        ep.close()

    def _on_response(
        self, w: _Worker, finished: list[tuple[Request, EdgeRuntimeError | None]]
    ) -> None:
        try:
            resp = protocol.read_response(w.resp_fd)
        except (EOFError, OSError):
            self._worker_lost(w, "", finished)
            return
        now = time.perf_counter_ns()
        if resp.status == protocol.ST_READY:
            w.state = _State.IDLE
            self._idle.append(w)
            self._check_all_started()
            return
        if resp.status == protocol.ST_LOAD_FAILED:
            log.error("worker %d could not load its models: %s", w.index, resp.text)
            if not self._ready.is_set():
                self._start_error = resp.text
            self._kill(w, f"load failed: {resp.text}")
            return
        reqs, w.inflight = w.inflight, []
        w.state = _State.IDLE
        self._idle.append(w)
        if not reqs:
            return
        metrics = self._metrics_list[reqs[0].model]
        if resp.status == protocol.ST_OK:
            for r in reqs:
                r.t_complete_ns = now
                metrics.record_many(
                    [
                        ("queue_wait", r.t_dispatch_ns - r.t_submit_ns),
                        ("to_worker", resp.t_start_ns - r.t_dispatch_ns),
                        ("preprocess", resp.t_pre_ns - resp.t_start_ns),
                        ("inference", resp.t_done_ns - resp.t_pre_ns),
                        ("from_worker", now - resp.t_done_ns),
                    ]
                )
                finished.append((r, None))
            metrics.count("completed", len(reqs))
        else:
            err = InferenceFailed(self.models[reqs[0].model].name, resp.text)
            finished.extend((r, err) for r in reqs)

    def _check_all_started(self) -> None:
        if not self._ready.is_set() and all(w.state is not _State.STARTING for w in self._workers):
            self._ready.set()

    def _worker_lost(
        self, w: _Worker, detail: str, finished: list[tuple[Request, EdgeRuntimeError | None]]
    ) -> None:
        if w.state is _State.DEAD:
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
        if w in self._idle:
            self._idle.remove(w)
        was_starting = w.state is _State.STARTING
        w.state = _State.DEAD
        if w.inflight:
            self._metrics_list[w.inflight[0].model].count("crashed", len(w.inflight))
            err = WorkerCrashed(w.index, reason)
            finished.extend((r, err) for r in w.inflight)
            w.inflight = []
        if self._closed:
            return
        log.warning("worker %d (pid %s) lost: %s", w.index, proc.pid, reason)
        if was_starting and not self._ready.is_set():
            self._start_error = self._start_error or reason
            self._check_all_started()
            return
        self._pending_restarts.append(w)
        self._restart_dead()

    def _close_worker_fds(self, w: _Worker) -> None:
        for fd in (w.req_fd, w.resp_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        w.req_fd = w.resp_fd = -1
        with contextlib.suppress(Exception):
            w.process.close()

    def _restart_dead(self) -> None:
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
            self._spawn(w)

    def _check_heartbeats(self) -> None:
        assert self._heartbeat is not None  # noqa: S101
        now = time.monotonic_ns()
        limit = int(self.config.heartbeat_timeout_s * 1e9)
        start_limit = int(self.config.start_timeout_s * 1e9)
        for w in self._workers:
            if w.state in (_State.IDLE, _State.BUSY):
                silent = now - int(self._heartbeat[w.index])
                if silent > limit and not w.kill_reason:
                    self._kill(w, f"stopped heart-beating for {silent / 1e9:.2f} s")
            elif w.state is _State.STARTING and now - w.started_ns > start_limit:
                self._kill(w, f"not ready after {self.config.start_timeout_s:g} s")

    def _kill(self, w: _Worker, reason: str) -> None:
        w.kill_reason = reason
        log.warning("killing worker %d: %s", w.index, reason)
        with contextlib.suppress(ProcessLookupError, AttributeError, TypeError):
            os.kill(w.process.pid, signal.SIGKILL)

    def _fail_all_if_no_workers(
        self, finished: list[tuple[Request, EdgeRuntimeError | None]]
    ) -> None:
        if self.degraded is None or any(w.state is not _State.DEAD for w in self._workers):
            return
        err = PoolClosed(f"no worker left: {self.degraded}")
        finished.extend((t.payload, err) for t in self._scheduler.drain())

    # -- status and shutdown -----------------------------------------------------------
    def worker_pids(self) -> list[int | None]:
        """The pid of each worker process (``None`` while one is down)."""
        with self._lock:
            return [
                w.process.pid if w.state is not _State.DEAD and w.process else None
                for w in self._workers
            ]

    def ready_workers(self) -> int:
        with self._lock:
            return sum(w.state in (_State.IDLE, _State.BUSY) for w in self._workers)

    def queued(self, model: str) -> int:
        """Requests of ``model`` waiting for a worker now."""
        with self._lock:
            return self._scheduler.queued(self._model_index(model))

    def restarts(self) -> int:
        return sum(w.restarts for w in self._workers)

    def stats(self) -> dict[str, Any]:
        """Per model: stage percentiles (ms) and counts; per pool: workers and restarts."""
        return {
            "models": {name: m.snapshot() for name, m in self.metrics.items()},
            "workers": self.config.workers,
            "ready_workers": self.ready_workers(),
            "restarts": self.restarts(),
            "degraded": self.degraded,
        }

    def reset_metrics(self) -> None:
        for m in self._metrics_list:
            m.reset()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the workers, fail whatever is queued or in flight, free the memory."""
        finished: list[tuple[Request, EdgeRuntimeError | None]] = []
        with self._lock:
            if self._closed and not self._started:
                return
            if self._closed and self._thread is None:
                return
            self._closed = True
            finished.extend((t.payload, PoolClosed()) for t in self._scheduler.drain())
            for w in self._workers:
                if w.state is not _State.DEAD and w.req_fd != -1:
                    with contextlib.suppress(OSError):
                        protocol.write_all(w.req_fd, protocol.pack_stop())
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        deadline = time.monotonic() + timeout_s
        for w in self._workers:
            if w.process is None:
                continue
            with contextlib.suppress(ValueError):
                w.process.join(max(0.0, deadline - time.monotonic()))
                if w.process.is_alive():
                    w.process.kill()
                    w.process.join(1.0)
            if w.inflight:
                finished.extend((r, PoolClosed()) for r in w.inflight)
                w.inflight = []
            w.state = _State.DEAD
            self._close_worker_fds(w)
        self._idle.clear()
        self._complete(finished)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._log_listener is not None:
            self._log_listener.stop()
            self._log_listener = None
        if self._log_queue is not None:
            self._log_queue.close()
            self._log_queue.join_thread()
            self._log_queue = None
        self._views.clear()
        self._heartbeat = None
        for seg in [*self._segments, *([self._control] if self._control else [])]:
            seg.close()
        self._segments.clear()
        self._control = None

    def __enter__(self) -> WorkerPool:
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ForwardHandler(logging.Handler):
    """Hands a worker's log record to this process's logger of the same name."""

    def emit(self, record: logging.LogRecord) -> None:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)


def _raise_io_thread_priority(priority: int) -> None:
    """Put the calling thread in SCHED_RR at ``priority`` (0: leave it as it is).

    The I/O thread runs for microseconds per request, but with both cores busy running
    pinned workers the kernel lets it wait out a worker's time slice (about one
    inference) before it runs; a low real-time priority lets it run at once. Needs
    CAP_SYS_NICE (root, or ``AmbientCapabilities=CAP_SYS_NICE`` in the systemd unit);
    without it the pool still works, with a longer tail.
    """
    if priority <= 0 or not hasattr(os, "sched_setscheduler"):
        return
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(priority))
    except OSError as exc:
        log.info("pool I/O thread stays at normal priority (%s)", exc)


def _worker_entry(spec: WorkerSpec, req_conn: Any, resp_conn: Any, log_queue: Any) -> None:
    worker_main(spec, req_conn.fileno(), resp_conn.fileno(), log_queue)
