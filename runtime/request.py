"""What a caller holds: a :class:`Reservation` (a queue place and a slot to fill) and a
:class:`Request` (a submitted inference to wait for, read, and release)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from runtime._internal import protocol
from runtime._internal.shm import SlotViews
from runtime.backends.base import Array
from runtime.errors import EdgeRuntimeError, InputShapeError, InputTooLarge, RequestTimeout
from runtime.scheduler import Priority

if TYPE_CHECKING:
    from runtime.metrics import ModelMetrics

log = logging.getLogger(__name__)


class SlotPool(Protocol):
    """What a request and a reservation need of the pool that holds their slot.

    The pool's dispatcher (:class:`runtime.dispatch.Dispatcher`) implements it; a
    request knows its pool only through these calls, so this module imports no pool.
    """

    def model_name(self, model: int) -> str:
        """The name of the model at index ``model``, for error messages."""
        ...

    def views(self, model: int) -> SlotViews:
        """The shared-memory views of ``model``'s slots (inputs, outputs, frames)."""
        ...

    def enqueue(self, request: Request) -> None:
        """Queue a filled reservation's request for a worker."""
        ...

    def cancel(self, request: Request) -> None:
        """Give back an unsubmitted reservation's queue place and slot."""
        ...

    def release(self, request: Request) -> None:
        """Free a finished request's slot (called once, by :meth:`Request.release`)."""
        ...

    def abandon(self, request: Request) -> None:
        """Stop waiting for ``request``: its slot is freed when it ends."""
        ...


class Request:
    """One submitted request. Wait for it, read its outputs, then release it.

    ``outputs`` are views into the request's shared-memory slot, valid until
    :meth:`release` (or the end of a ``with`` block). The time from the pool reading
    the worker's answer until the caller has it (its :meth:`wait` returns, or its
    callback starts) is recorded as the handback stage, from then until release as the
    postprocess stage.
    """

    __slots__ = (
        "_callback",
        "_done",
        "_error",
        "_pool",
        "_released",
        "abandoned",
        "deadline_ns",
        "frame_shape",
        "model",
        "priority",
        "slot",
        "t0_ns",
        "t_complete_ns",
        "t_dispatch_ns",
        "t_enqueue_ns",
        "t_handed_ns",
        "t_submit_ns",
    )

    def __init__(
        self,
        pool: SlotPool,
        model: int,
        slot: int,
        priority: Priority,
        t0_ns: int,
        deadline_ns: int | None,
        callback: Callable[[Request], None] | None,
    ) -> None:
        self._pool = pool
        self.model = model
        self.slot = slot
        self.priority = priority
        self.t0_ns = t0_ns
        self.t_submit_ns = 0
        self.t_enqueue_ns = 0
        self.t_dispatch_ns = 0
        self.t_handed_ns = 0
        self.t_complete_ns = 0
        self.deadline_ns = deadline_ns
        self.frame_shape: tuple[int, int, int] | None = None
        self._callback = callback
        self._done = threading.Event()
        self._error: EdgeRuntimeError | None = None
        self._released = False
        self.abandoned = False

    @property
    def error(self) -> EdgeRuntimeError | None:
        return self._error

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float | None = 10.0) -> Request:
        """Block until the request completes; return it or raise its error.

        Raises:
            Overloaded, DeadlineExceeded, WorkerCrashed, InferenceFailed, PoolClosed:
                how the request ended.
            RequestTimeout: ``timeout_s`` passed first; the request is abandoned and
                its slot freed when it ends.
        """
        if not self._done.wait(timeout_s):
            self._pool.abandon(self)
            raise RequestTimeout(self._pool.model_name(self.model), timeout_s or 0.0)
        if not self.t_handed_ns:
            self.t_handed_ns = time.perf_counter_ns()
        if self._error is not None:
            raise self._error
        return self

    @property
    def outputs(self) -> list[Array]:
        if self._released or not self._done.is_set() or self._error is not None:
            raise RuntimeError("outputs are only readable after success and before release")
        return self._pool.views(self.model).outputs[self.slot]

    def release(self) -> None:
        """Free the slot (idempotent)."""
        if not self._released:
            self._released = True
            self._pool.release(self)

    def __enter__(self) -> Request:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def mark_released(self) -> None:
        """The pool took the slot back itself (a failed request has nothing to read):
        :meth:`release` does nothing from now on."""
        self._released = True

    def finish(self, error: EdgeRuntimeError | None) -> None:
        """End the request (the pool's I/O thread calls it once): wake waiters, call the
        callback."""
        self._error = error
        self._done.set()
        if self._callback is not None:
            self.t_handed_ns = time.perf_counter_ns()
            try:
                self._callback(self)
            except Exception:
                log.exception("request callback raised")


class SlotReturns:
    """``release`` and ``abandon`` of a :class:`SlotPool` that keeps each model's free
    slots in a list under one lock (the process pool's dispatcher and the inline lanes):
    a released slot's hand-back, post-processing and total times are recorded, and the
    slot goes back on its list."""

    lock: threading.Lock
    _free: list[list[int]]
    _metrics: Sequence[ModelMetrics]

    def release(self, request: Request) -> None:
        if request.error is None and request.t_complete_ns:
            now = time.perf_counter_ns()
            handed = request.t_handed_ns or now
            self._metrics[request.model].record_many(
                [
                    ("handback", handed - request.t_complete_ns),
                    ("postprocess", now - handed),
                    ("total", now - request.t0_ns),
                ]
            )
        with self.lock:
            self._free[request.model].append(request.slot)

    def abandon(self, request: Request) -> None:
        with self.lock:
            request.abandoned = True
            done = request.done()
        if done:
            request.release()


class Reservation:
    """A held queue place and slot: write the input in place, then :meth:`submit`.

    Leaving a ``with`` block without submitting gives the place back.
    """

    def __init__(self, pool: SlotPool, request: Request) -> None:
        self._pool = pool
        self._request = request
        self._submitted = False

    @property
    def inputs(self) -> list[Array]:
        """The slot's input tensors, in model input order."""
        return self._pool.views(self._request.model).inputs[self._request.slot]

    def frame(self, height: int, width: int, channels: int = 3) -> Array:
        """A uint8 frame buffer in the slot for the worker to preprocess.

        Raises:
            InputTooLarge: the frame does not fit the slot's frame area.
            InputShapeError: a side is 0 (the worker would take the slot's tensor as
                it is) or more than the protocol carries (65535), or channels is not
                1 or 3.
        """
        limit = protocol.MAX_FRAME_SIDE
        if not all(0 < n <= limit for n in (height, width)) or channels not in (1, 3):
            name = self._pool.model_name(self._request.model)
            raise InputShapeError(name, (limit, limit, 3), (height, width, channels))
        need = height * width * channels
        layout = self._pool.views(self._request.model).layout
        if need > layout.frame_bytes:
            name = self._pool.model_name(self._request.model)
            raise InputTooLarge(name, layout.frame_bytes, need)
        self._request.frame_shape = (height, width, channels)
        return self._pool.views(self._request.model).frame(
            self._request.slot, (height, width, channels)
        )

    def submit(self) -> Request:
        self._submitted = True
        self._pool.enqueue(self._request)
        return self._request

    def cancel(self) -> None:
        if not self._submitted:
            self._submitted = True
            self._pool.cancel(self._request)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()
