"""The worker process: pinned to one core, holds every model's session warm, and runs
requests that arrive as slot indexes, reading inputs from and writing outputs to shared
memory.

Started with the ``spawn`` method, so the worker inherits no threads or locks from the
pool's process. It reports READY (or LOAD_FAILED with the reason) once every model is
loaded and warmed up, beats a heartbeat into shared memory at least every
``heartbeat_interval_s`` while idle and before each request, and logs through a queue
to the parent.

Between requests the worker may spin for ``spin_ns`` (polling its pipe without
blocking and yielding its core between polls) before it blocks: a core that never went
to sleep starts the next request without a sleeping core's wake-up, and the yield lets
any other thread that wants the core have it at once. With pipelining the pool has
usually queued the next request already, and the worker reads it without waiting.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import logging.handlers
import os
import select
import signal
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime._internal import protocol
from runtime._internal.shm import Segment, SlotLayout, SlotViews
from runtime.backends import BackendOptions, open_model
from runtime.backends.base import Array, Backend, Binding
from runtime.preprocess import Preprocessor, PreprocessSpec

log = logging.getLogger("runtime.worker")


@dataclass(frozen=True)
class WorkerModel:
    name: str
    path: str
    backend: str
    input_shapes: dict[str, tuple[int, ...]]
    layout: SlotLayout
    segment_path: str
    preprocess: PreprocessSpec | None
    max_batch: int


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    core: int | None
    options: BackendOptions
    models: tuple[WorkerModel, ...]
    control_path: str
    control_size: int
    heartbeat_interval_s: float
    nice: int = 0
    spin_ns: int = 0


class _Model:
    """A model as one worker holds it: session, slot views, bindings, preprocessors."""

    def __init__(self, spec: WorkerModel, options: BackendOptions) -> None:
        self.spec = spec
        self.backend: Backend = open_model(spec.path, options, spec.backend)
        self.backend.prepare(spec.input_shapes)
        self.segment = Segment.attach(spec.segment_path, spec.layout.total_bytes)
        self.views = SlotViews(self.segment, spec.layout)
        self.bindings: list[Binding] = [
            self.backend.bind(self.views.inputs[i], self.views.outputs[i])
            for i in range(spec.layout.n_slots)
        ]
        first_in = self.backend.inputs[0]
        self.pre: Preprocessor | None = None
        if spec.preprocess is not None:
            self.pre = Preprocessor(spec.preprocess, first_in.concrete_shape(), first_in.dtype)
        # Batching: private buffers of max_batch rows, one binding per batch size.
        self.batch_in: list[Array] = []
        self.batch_out: list[Array] = []
        self.batches: dict[int, tuple[Backend, Binding]] = {}
        if spec.max_batch > 1:
            self.batch_in = [
                np.empty((spec.max_batch, *f.shape[1:]), f.dtype) for f in spec.layout.inputs
            ]
            self.batch_out = [
                np.empty((spec.max_batch, *f.shape[1:]), f.dtype) for f in spec.layout.outputs
            ]
            for n in range(2, spec.max_batch + 1):
                variant = self.backend.batch_variant(n)
                binding = variant.bind(
                    [a[:n] for a in self.batch_in], [a[:n] for a in self.batch_out]
                )
                self.batches[n] = (variant, binding)
        self.backend.warm_up()

    def close(self) -> None:
        """Close the sessions and unmap the slots (inline mode; a worker just exits)."""
        self.bindings.clear()
        for variant, _binding in self.batches.values():
            variant.close()
        self.batches.clear()
        self.backend.close()
        self.segment.close()

    def run(self, slots: list[protocol.SlotRef]) -> tuple[int, int]:
        """Run one request (or batch). Returns (preprocess done, inference done) times."""
        if self.pre is not None:
            for ref in slots:
                if ref.frame_shape is not None:
                    frame = self.views.frame(ref.slot, ref.frame_shape)
                    self.pre.run(frame, self.views.inputs[ref.slot][0])
        t_pre = time.perf_counter_ns()
        if len(slots) == 1:
            self.backend.run_bound(self.bindings[slots[0].slot])
            return t_pre, time.perf_counter_ns()
        n = len(slots)
        for row, ref in enumerate(slots):
            for buf, src in zip(self.batch_in, self.views.inputs[ref.slot], strict=True):
                buf[row] = src[0]
        variant, binding = self.batches[n]
        variant.run_bound(binding)
        for row, ref in enumerate(slots):
            for buf, dst in zip(self.batch_out, self.views.outputs[ref.slot], strict=True):
                dst[0] = buf[row]
        return t_pre, time.perf_counter_ns()


def _pin(core: int | None) -> None:
    if core is not None and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {core})
        except OSError as exc:
            log.warning("could not pin worker to core %d: %s", core, exc)


def _name_process(index: int) -> None:
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as f:
        f.write(f"edgefleet-w{index}")


def _wait_for_request(poller: select.poll, spin_ns: int, timeout_ms: int) -> bool:
    """Wait until the request pipe is readable: spin up to ``spin_ns`` (polling without
    blocking, yielding the core between polls), then block up to ``timeout_ms``."""
    if poller.poll(0):
        return True
    if spin_ns > 0:
        end = time.perf_counter_ns() + spin_ns
        while time.perf_counter_ns() < end:
            os.sched_yield()
            if poller.poll(0):
                return True
    return bool(poller.poll(timeout_ms))


def worker_main(spec: WorkerSpec, req_fd: int, resp_fd: int, log_queue: Any) -> None:
    """Entry point of a worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the pool decides when workers stop
    faulthandler.enable()
    root = logging.getLogger()
    root.handlers[:] = [logging.handlers.QueueHandler(log_queue)]
    root.setLevel(logging.INFO)
    _name_process(spec.index)
    _pin(spec.core)
    if spec.nice > 0:
        with contextlib.suppress(OSError):
            os.nice(spec.nice)
    control = Segment.attach(spec.control_path, spec.control_size)
    heartbeat = control.array(0, (control.size // 8,), np.dtype(np.int64))
    hb_index = spec.index
    heartbeat[hb_index] = time.monotonic_ns()
    try:
        models = [_Model(m, spec.options) for m in spec.models]
    except Exception as exc:
        log.exception("worker %d failed to load its models", spec.index)
        protocol.write_all(
            resp_fd, protocol.pack_response(protocol.ST_LOAD_FAILED, 0, 0, 0, str(exc))
        )
        return
    protocol.write_all(resp_fd, protocol.pack_response(protocol.ST_READY, 0, 0, 0))
    poller = select.poll()
    poller.register(req_fd, select.POLLIN)
    timeout_ms = int(spec.heartbeat_interval_s * 1000)
    while True:
        heartbeat[hb_index] = time.monotonic_ns()
        if not _wait_for_request(poller, spec.spin_ns, timeout_ms):
            continue
        try:
            op, model_index, slots = protocol.read_request(req_fd)
        except EOFError:
            return  # the pool is gone
        if op == protocol.OP_STOP:
            return
        heartbeat[hb_index] = time.monotonic_ns()
        t_start = time.perf_counter_ns()
        expired = 0
        live = slots
        if any(ref.deadline_ns for ref in slots):
            for i, ref in enumerate(slots[: protocol.MASK_BITS]):
                if ref.deadline_ns and ref.deadline_ns <= t_start:
                    expired |= 1 << i
            if expired:
                live = [r for i, r in enumerate(slots) if not expired >> i & 1]
        try:
            t_pre, t_done = models[model_index].run(live) if live else (t_start, t_start)
        except Exception as exc:  # reported to the caller as InferenceFailed
            log.debug("inference failed", exc_info=True)
            now = time.perf_counter_ns()
            msg = protocol.pack_response(
                protocol.ST_FAILED, t_start, now, now, f"{type(exc).__name__}: {exc}"
            )
        else:
            msg = protocol.pack_response(protocol.ST_OK, t_start, t_pre, t_done, "", expired)
        protocol.write_all(resp_fd, msg)
