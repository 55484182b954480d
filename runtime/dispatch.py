"""The pool's queues and its one I/O thread.

Slot ids move here: a caller reserves a slot and a queue place, fills the slot and
enqueues it; the I/O thread hands the next batch of slot ids to a free worker the
moment one is, reads the worker's answer, records the stage timings, and finishes the
requests (outside the lock: a callback may submit more work). It also sweeps: worker
heartbeats and restarts (through the :class:`runtime.supervisor.Supervisor`) and queued
requests past their deadline.

With pipelining, a busy worker also gets the next batch queued ahead in its pipe, so
it starts it the moment it answers the one before, without waiting for the I/O thread
to read the answer and send more. Idle workers are always served first, and a batch
queued ahead counts against its model's queue bound like a queued one.

The scheduling rules live in :mod:`runtime.scheduler` (pure); this module is the shell.
:class:`Dispatcher` is the :class:`runtime.request.SlotPool` that requests talk to.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Sequence

from runtime._internal import protocol
from runtime._internal.shm import SlotViews
from runtime.errors import (
    DeadlineExceeded,
    EdgeRuntimeError,
    InferenceFailed,
    Overloaded,
    PoolClosed,
)
from runtime.metrics import ModelMetrics
from runtime.request import Request, SlotReturns
from runtime.scheduler import QueuePolicy, Scheduler, Ticket
from runtime.supervisor import Finished, Supervisor, Worker, WorkerState

log = logging.getLogger(__name__)

_SWEEP_NS = 20_000_000  # heartbeat and deadline checks at least this often


class Dispatcher(SlotReturns):
    """Free slots, the scheduler's queues and the I/O thread of one pool.

    ``lock`` guards all of it and the supervisor's workers; ``closed`` is true before
    :meth:`open` and from :meth:`close` on.
    """

    def __init__(
        self,
        names: Sequence[str],
        policies: list[QueuePolicy],
        metrics: Sequence[ModelMetrics],
        supervisor: Supervisor,
        io_thread_rt_priority: int = 0,
        pipelining: bool = False,
    ) -> None:
        self._names = list(names)
        self._batching = [p.max_batch > 1 for p in policies]
        self._bounds = [p.queue_bound for p in policies]
        self._metrics = metrics
        self._supervisor = supervisor
        self._rt_priority = io_thread_rt_priority
        self._depth = 2 if pipelining else 1
        self.lock = threading.Lock()
        self._scheduler = Scheduler(policies)
        self._views: list[SlotViews] = []
        self._free: list[list[int]] = []
        self.closed = True
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1

    def open(self, views: Sequence[SlotViews]) -> None:
        """Take each model's slots (all free) and accept work; no thread yet."""
        self._views = list(views)
        self._free = [list(range(v.layout.n_slots - 1, -1, -1)) for v in views]
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.closed = False

    def start_thread(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="edgefleet-pool-io", daemon=True)
        self._thread.start()

    # -- what requests need (SlotPool) -------------------------------------------------
    def model_name(self, model: int) -> str:
        return self._names[model]

    def views(self, model: int) -> SlotViews:
        return self._views[model]

    def reserve(self, model: int) -> int:
        """Hold a queue place and a slot of ``model``; the slot's index.

        Raises:
            Overloaded: the model's queue is full.
            PoolClosed: the pool is closed or has no worker left.
        """
        with self.lock:
            if self.closed:
                raise PoolClosed()
            if self._supervisor.all_dead():
                raise PoolClosed(f"no worker left: {self._supervisor.degraded}")
            ahead = self._ahead(model) if self._depth > 1 else 0
            if not self._free[model] or not self._scheduler.reserve(model, ahead):
                self._metrics[model].count("refused")
                raise Overloaded(self._names[model], self._bounds[model])
            return self._free[model].pop()

    def _ahead(self, model: int) -> int:
        """Requests of ``model`` queued ahead at busy workers (lock held)."""
        n = 0
        for w in self._supervisor.workers:
            if len(w.inflight) > 1:
                n += sum(len(b) for b in list(w.inflight)[1:] if b[0].model == model)
        return n

    def enqueue(self, request: Request) -> None:
        now = time.perf_counter_ns()
        request.t_enqueue_ns = now
        ticket = Ticket(request.model, request.priority, now, request.deadline_ns, request)
        finished: Finished = []
        with self.lock:
            if self.closed:
                self._scheduler.unreserve(request.model)
                finished.append((request, PoolClosed()))
            else:
                self._metrics[request.model].count("submitted")
                self._scheduler.enqueue(ticket)
                self._dispatch(ticket.enqueued_ns, finished)
                if self._batching[request.model]:
                    self._wake()
        self._complete(finished)

    def cancel(self, request: Request) -> None:
        with self.lock:
            self._scheduler.unreserve(request.model)
            self._free[request.model].append(request.slot)

    def queued(self, model: int) -> int:
        with self.lock:
            return self._scheduler.queued(model)

    def busy(self) -> bool:
        """Whether a new request would wait: one of any model is queued (or queued ahead
        at a busy worker), or no worker is idle."""
        with self.lock:
            if self._scheduler.total_queued() or not self._supervisor.idle:
                return True
            return any(len(w.inflight) > 1 for w in self._supervisor.workers)

    # -- moving slot ids ---------------------------------------------------------------
    def _next_worker(self) -> Worker | None:
        """An idle worker, else (pipelining) a busy one with nothing queued ahead: the
        one whose running batch was sent first, as it should finish first."""
        idle = self._supervisor.idle
        if idle:
            return idle[-1]
        if self._depth == 1:
            return None
        best: Worker | None = None
        for w in self._supervisor.workers:
            if w.state is not WorkerState.BUSY or len(w.inflight) >= self._depth:
                continue
            if best is None or w.inflight[0][0].t_dispatch_ns < best.inflight[0][0].t_dispatch_ns:
                best = w
        return best

    def _dispatch(self, now: int, finished: Finished) -> None:
        """Give queued work to idle workers, then (pipelining) queue one batch ahead at
        each busy worker. Called with the lock held."""
        idle = self._supervisor.idle
        while True:
            worker = self._next_worker()
            if worker is None:
                return
            batch, expired = self._scheduler.next_batch(now)
            if expired:
                finished.extend((t.payload, self._expired_error(t, now)) for t in expired)
            if not batch:
                return
            reqs: list[Request] = [t.payload for t in batch]
            msg = protocol.pack_run(
                batch[0].model,
                [protocol.SlotRef(r.slot, r.frame_shape, r.deadline_ns or 0) for r in reqs],
            )
            # only once the message is built: nothing can lose it
            if worker.state is WorkerState.IDLE:
                idle.pop()
            worker.state = WorkerState.BUSY
            worker.inflight.append(reqs)
            sent_ns = time.perf_counter_ns()
            for r in reqs:
                r.t_dispatch_ns = sent_ns
            try:
                protocol.write_all(worker.req_fd, msg)
            except OSError as exc:
                self._supervisor.lost(worker, f"request pipe failed: {exc}", finished)

    def _expired_error(self, t: Ticket, now: int) -> EdgeRuntimeError:
        self._metrics[t.model].count("expired")
        late = (now - (t.deadline_ns or now)) / 1e6
        return DeadlineExceeded(self._names[t.model], late)

    def _complete(self, finished: Finished) -> None:
        """Finish requests outside the lock (callbacks may submit more work)."""
        for req, error in finished:
            if error is not None:
                if not isinstance(error, (DeadlineExceeded,)):
                    self._metrics[req.model].count("failed")
                req.mark_released()
                with self.lock:
                    self._free[req.model].append(req.slot)
            req.finish(error)
            if req.abandoned and error is None:
                req.release()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    # -- the I/O thread ----------------------------------------------------------------
    def _loop(self) -> None:
        _raise_io_thread_priority(self._rt_priority)
        sup = self._supervisor
        ep = select.epoll()
        ep.register(self._wake_r, select.EPOLLIN)
        registered: dict[int, tuple[str, Worker]] = {}
        last_sweep = 0
        while True:
            with self.lock:
                if self.closed:
                    break
                for w in sup.workers:
                    if w.state is not WorkerState.DEAD and w.resp_fd not in registered:
                        ep.register(w.resp_fd, select.EPOLLIN)
                        ep.register(w.sentinel, select.EPOLLIN)
                        registered[w.resp_fd] = ("resp", w)
                        registered[w.sentinel] = ("exit", w)
                wake = self._scheduler.next_wakeup(time.perf_counter_ns())
            timeout_ns = _SWEEP_NS
            if wake is not None:
                timeout_ns = max(0, min(timeout_ns, wake - time.perf_counter_ns()))
            events = ep.poll(timeout_ns / 1e9)
            finished: Finished = []
            with self.lock:
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
                        sup.lost(w, "", finished)
                    if w.state is WorkerState.DEAD:
                        for gone in (w.resp_fd, w.sentinel):
                            if registered.pop(gone, None) is not None:
                                with contextlib.suppress(OSError, ValueError):
                                    ep.unregister(gone)
                        sup.close_fds(w)
                now = time.perf_counter_ns()
                if now - last_sweep >= _SWEEP_NS:
                    last_sweep = now
                    sup.check_heartbeats()
                    sup.restart_dead()
                    finished.extend(
                        (t.payload, self._expired_error(t, now))
                        for t in self._scheduler.expire(now)
                    )
                    self._fail_all_if_no_workers(finished)
                self._dispatch(now, finished)
            self._complete(finished)
        ep.close()

    def _on_response(self, w: Worker, finished: Finished) -> None:
        try:
            resp = protocol.read_response(w.resp_fd)
        except (EOFError, OSError):
            self._supervisor.lost(w, "", finished)
            return
        now = time.perf_counter_ns()
        if resp.status == protocol.ST_READY:
            self._supervisor.on_ready(w)
            return
        if resp.status == protocol.ST_LOAD_FAILED:
            self._supervisor.on_load_failed(w, resp.text)
            return
        if not w.inflight:
            self._supervisor.make_idle(w)
            return
        reqs = w.inflight.popleft()
        if not w.inflight:
            self._supervisor.make_idle(w)
        metrics = self._metrics[reqs[0].model]
        if resp.status == protocol.ST_OK:
            done = 0
            for i, r in enumerate(reqs):
                if resp.expired >> i & 1:
                    late = (resp.t_start_ns - (r.deadline_ns or resp.t_start_ns)) / 1e6
                    metrics.count("expired")
                    finished.append((r, DeadlineExceeded(self._names[r.model], late)))
                    continue
                done += 1
                r.t_complete_ns = now
                metrics.record_many(
                    [
                        ("submit", r.t_enqueue_ns - r.t_submit_ns),
                        ("queue_wait", r.t_dispatch_ns - r.t_enqueue_ns),
                        ("to_worker", resp.t_start_ns - r.t_dispatch_ns),
                        ("preprocess", resp.t_pre_ns - resp.t_start_ns),
                        ("inference", resp.t_done_ns - resp.t_pre_ns),
                        ("from_worker", now - resp.t_done_ns),
                    ]
                )
                finished.append((r, None))
            metrics.count("completed", done)
        else:
            err = InferenceFailed(self._names[reqs[0].model], resp.text)
            finished.extend((r, err) for r in reqs)

    def _fail_all_if_no_workers(self, finished: Finished) -> None:
        if not self._supervisor.all_dead():
            return
        err = PoolClosed(f"no worker left: {self._supervisor.degraded}")
        finished.extend((t.payload, err) for t in self._scheduler.drain())

    # -- shutdown ----------------------------------------------------------------------
    def close(self, timeout_s: float) -> bool:
        """Stop the I/O thread and the workers, fail whatever is queued or in flight.
        False when there was nothing to close (never opened, or closed already)."""
        finished: Finished = []
        with self.lock:
            if self.closed and self._thread is None:
                return False
            self.closed = True
            finished.extend((t.payload, PoolClosed()) for t in self._scheduler.drain())
            self._supervisor.send_stop()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self._supervisor.join_all(timeout_s, finished)
        self._complete(finished)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._views.clear()
        return True


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
