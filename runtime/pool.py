"""The worker pool: pinned worker processes, shared-memory slots, one I/O thread.

Callers reserve a slot (refused at once when the model's queue is full), put the input
in it (or a raw frame the worker preprocesses), and submit. Only the slot index travels
to a worker, over a pipe; the worker runs the model reading from and writing to shared
memory, and answers with its timings.

:class:`WorkerPool` is the facade: it probes the models (:mod:`runtime.probe`), sizes
the slots, and wires the two parts that run the pool: the supervisor of the worker
processes (:mod:`runtime.supervisor`: spawn, heartbeats, restart budget) and the
dispatcher (:mod:`runtime.dispatch`: queues, the I/O thread, completions).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from runtime._internal.shm import Segment, SlotLayout, SlotViews
from runtime._internal.worker import WorkerModel
from runtime.backends import BackendOptions
from runtime.backends.base import Array
from runtime.config import ModelConfig, PoolConfig
from runtime.dispatch import Dispatcher
from runtime.errors import EdgeRuntimeError, InputDtypeError, InputShapeError, InputTooLarge
from runtime.inline import InlineLanes
from runtime.metrics import ModelMetrics
from runtime.probe import ModelInfo, probe_model
from runtime.request import Request, Reservation
from runtime.scheduler import Priority, QueuePolicy
from runtime.supervisor import Supervisor

__all__ = ["WorkerPool"]


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
        options = BackendOptions(
            threads=self.config.threads_per_worker,
            providers=self.config.providers,
            delegates=self.config.delegates,
            spin_wait=self.config.spin_wait,
        )
        # Probe every model here, before any worker exists: a bad file fails now,
        # naming the file, and the probe tells us the tensor shapes to allocate.
        self.models: list[ModelInfo] = [
            probe_model(m, options.providers, options.delegates) for m in self._configs
        ]
        self._index = {m.name: i for i, m in enumerate(self.models)}
        self.metrics = {m.name: ModelMetrics() for m in self.models}
        self._metrics_list = [self.metrics[m.name] for m in self.models]
        self._inline: InlineLanes | None = None
        if self.config.execution_mode == "inline":
            self._inline = InlineLanes(
                [m.name for m in self.models],
                [c.queue_bound for c in self._configs],
                self._metrics_list,
                self.config,
                options,
            )
        self._supervisor: Supervisor | InlineLanes = self._inline or Supervisor(
            self.config, options, self._metrics_list
        )
        self._dispatcher: Dispatcher | InlineLanes = self._inline or Dispatcher(
            [m.name for m in self.models],
            [
                QueuePolicy(
                    c.queue_bound,
                    c.batching.max_batch,
                    c.batching.max_wait_us * 1000,
                )
                for c in self._configs
            ],
            self._metrics_list,
            self._supervisor,  # type: ignore[arg-type]  # a Supervisor in pool mode
            self.config.io_thread_rt_priority,
            pipelining=self.config.pipelining,
        )
        self._segments: list[Segment] = []
        self._started = False

    @property
    def degraded(self) -> str | None:
        """Why the pool runs short of workers (its restart budget is spent), or None."""
        return self._supervisor.degraded

    def start(self) -> WorkerPool:
        """Allocate slots, start the workers and wait until every one is warm.

        Raises:
            EdgeRuntimeError: a worker could not load its models in time.
        """
        if self._started:
            raise RuntimeError("pool already started")
        self._started = True
        n_workers = self.config.workers
        views: list[SlotViews] = []
        worker_models: list[WorkerModel] = []
        for i, (cfg, info) in enumerate(zip(self._configs, self.models, strict=True)):
            extra = self.config.extra_slots if self.config.extra_slots is not None else n_workers
            # queued + running (+ one batch queued ahead per worker) + held by callers
            depth = 2 if self.config.pipelining and self._inline is None else 1
            n_slots = cfg.queue_bound + depth * n_workers * cfg.batching.max_batch + extra
            frame_bytes = cfg.max_frame_bytes if cfg.preprocess is not None else 0
            layout = SlotLayout.build(
                n_slots,
                frame_bytes,
                [(s.concrete_shape(), s.dtype.str) for s in info.inputs],
                [(s.concrete_shape(), s.dtype.str) for s in info.outputs],
            )
            seg = Segment.create(f"m{i}", layout.total_bytes)
            self._segments.append(seg)
            views.append(SlotViews(seg, layout))
            worker_models.append(
                WorkerModel(
                    name=info.name,
                    path=info.path,
                    backend=info.backend,
                    input_shapes={s.name: s.concrete_shape() for s in info.inputs},
                    layout=layout,
                    segment_path=str(seg.path),
                    preprocess=cfg.preprocess,
                    max_batch=cfg.batching.max_batch,
                )
            )
        self._dispatcher.open(views)
        self._supervisor.start(tuple(worker_models), self._dispatcher.lock)
        self._dispatcher.start_thread()
        if not self._supervisor.ready.wait(self.config.start_timeout_s + 5):
            self.close()
            raise EdgeRuntimeError("workers did not become ready in time")
        if self._supervisor.start_error is not None:
            err = self._supervisor.start_error
            self.close()
            raise EdgeRuntimeError(f"a worker could not start: {err}")
        return self

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
        slot = self._dispatcher.reserve(mi)
        deadline = now + int(deadline_s * 1e9) if deadline_s is not None else None
        req = Request(self._dispatcher, mi, slot, priority, t0_ns or now, deadline, callback)
        req.t_submit_ns = now
        return Reservation(self._dispatcher, req)

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

    # -- status and shutdown -----------------------------------------------------------
    def worker_pids(self) -> list[int | None]:
        """The pid of each worker process (``None`` while one is down)."""
        with self._dispatcher.lock:
            return self._supervisor.pids()

    def ready_workers(self) -> int:
        with self._dispatcher.lock:
            return self._supervisor.ready_count()

    def queued(self, model: str) -> int:
        """Requests of ``model`` waiting for a worker now."""
        return self._dispatcher.queued(self._model_index(model))

    def busy(self) -> bool:
        """Whether a request submitted now would wait for a worker: a request of any
        model is queued, or no worker is idle. Non-blocking (one short lock); for work
        that must only use spare capacity (a shadow model at background priority skips
        its frame instead of queueing behind the live path)."""
        return self._dispatcher.busy()

    def restarts(self) -> int:
        return self._supervisor.restarts()

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

    @property
    def execution_mode(self) -> str:
        """``"pool"`` (worker processes) or ``"inline"`` (sessions on the callers'
        threads)."""
        return self.config.execution_mode

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the workers, fail whatever is queued or in flight, free the memory."""
        if isinstance(self._dispatcher, InlineLanes):
            if not self._dispatcher.close_lanes(timeout_s):
                return
        else:
            if not self._dispatcher.close(timeout_s):
                return
            assert isinstance(self._supervisor, Supervisor)  # noqa: S101 - pool mode
            self._supervisor.close()
        for seg in self._segments:
            seg.close()
        self._segments.clear()

    def __enter__(self) -> WorkerPool:
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
