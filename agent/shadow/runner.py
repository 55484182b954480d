"""One pipeline's shadow: a thread that runs the candidate on the frames the live
pipeline offers it, compares, stores and counts.

The live decider calls :meth:`ShadowRunner.offer` after it emitted a decision: a sampler
check (:class:`agent.shadow.sampler.Sampler`) and at most an append to a queue of
``queue_bound`` frames (one by default) -- O(1), no waiting. A frame that finds the queue
full is skipped and counted. The shadow thread then, per frame:

1. skips it (counted) when the pool is busy (:meth:`runtime.WorkerPool.busy`: a request
   waits, or no worker is idle) or refuses it (queue full);
2. submits it to the candidate at :attr:`runtime.Priority.BACKGROUND` (every live request
   goes first), waits, post-processes with the candidate's post-processor;
3. for a chain, runs the live chain's later stages on the candidate's detections (also
   at background priority), so the candidate is judged as the whole pipeline would be;
4. decides with the LIVE pipeline's policy, compares with the live decision
   (:func:`agent.shadow.compare.compare`), writes a ``shadow_results`` row (with the
   frame as a thumbnail when they disagree) and adds to the candidate's totals.

It never emits a decision, never dispatches an action and never touches the live row.
Latency of either model is the pool's dispatch-to-completion time of its first stage
(preprocess and inference in the worker), not the wait in the queue: a background
request waits for the live ones by design, and that says nothing of the candidate.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.decisionlog.record import new_id
from agent.pipeline.runner import Decision, Stage, result_items, run_chain
from agent.policy import PolicySpec, decide
from agent.shadow.compare import compare
from agent.shadow.sampler import Sampler
from agent.shadow.stats import ShadowKey, ShadowStats
from agent.shadow.store import ShadowRow, ShadowStore
from runtime import EdgeRuntimeError, Overloaded, Priority, WorkerPool

log = logging.getLogger(__name__)

_POLL_S = 0.2
_LOG_EVERY = 100
"""After the first, every this many-th shadow error is logged."""


@dataclass
class _Job:
    decision: Decision
    data: np.ndarray
    is_image: bool


@dataclass
class ShadowCounts:
    """One shadow runner's counters (the candidate's totals are in its ShadowStats)."""

    compared: int = 0
    agreed: int = 0
    skipped_busy: int = 0
    skipped_behind: int = 0
    errors: int = 0
    last_error: str = ""


class ShadowRunner:
    """The shadow of one pipeline. ``start()``; the pipeline's hook is :meth:`offer`;
    ``stop()`` and ``join()``; the store is closed when the thread ends.

    Args:
        pipeline: the live pipeline's name (the thread's name, logs).
        pool: the runtime's pool, serving the candidate as ``candidate.model``.
        candidate: the candidate's first stage (its bundle, model name, post-processor).
        live_stages: the live pipeline's stages (the later ones run on the candidate's
            detections).
        policy: the live pipeline's policy.
        key: which candidate (for the rows).
        stats: the candidate's totals (shared by the pipelines that run it).
        store: where rows and thumbnails go (used on the shadow thread only).
    """

    def __init__(
        self,
        pipeline: str,
        *,
        pool: WorkerPool,
        candidate: Stage,
        live_stages: Sequence[Stage],
        policy: PolicySpec,
        key: ShadowKey,
        stats: ShadowStats,
        store: ShadowStore,
        sampler: Sampler,
        iou_threshold: float = 0.5,
        wait_timeout_s: float = 10.0,
        queue_bound: int = 1,
    ) -> None:
        if not 1 <= queue_bound <= 2:
            raise ValueError(f"a shadow queue holds 1 or 2 frames, got {queue_bound}")
        self.pipeline = pipeline
        self.pool = pool
        self.candidate = candidate
        self.live_stages = list(live_stages)
        self.policy = policy
        self.key = key
        self.stats = stats
        self.store = store
        self.sampler = sampler
        self.iou_threshold = iou_threshold
        self.wait_timeout_s = wait_timeout_s
        self.queue_bound = queue_bound
        self.counts = ShadowCounts()
        self._jobs: deque[_Job] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the live side -----------------------------------------------------------------
    def offer(self, decision: Decision, data: np.ndarray, is_image: bool) -> None:
        """The pipeline's shadow hook (the decider thread, after the emit): take the frame
        if the sampler does and the queue has room, else nothing or a count. O(1)."""
        if self._stop.is_set() or not self.sampler.take(time.monotonic()):
            return
        if len(self._jobs) >= self.queue_bound:
            self.counts.skipped_behind += 1
            self.stats.skip()
            return
        self._jobs.append(_Job(decision, data, is_image))
        self._wake.set()

    # -- the thread --------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name=f"shadow-{self.pipeline}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Take no more frames; the thread ends after the frame it holds."""
        self._stop.set()
        self._wake.set()

    def join(self, timeout_s: float) -> bool:
        t = self._thread
        if t is not None:
            t.join(timeout_s)
        return t is None or not t.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def pending(self) -> int:
        """Frames offered and not yet taken by the thread."""
        return len(self._jobs)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._jobs:
                    self._wake.wait(_POLL_S)
                    self._wake.clear()
                    self.store.flush_due()
                    continue
                job = self._jobs.popleft()
                try:
                    self.run(job.decision, job.data, job.is_image)
                except Exception as e:  # a shadow bug must not end the shadow thread
                    log.exception("shadow of pipeline %s: unexpected error", self.pipeline)
                    self._error(f"{type(e).__name__}: {e}")
        finally:
            # offered and never run: the shadow had not caught up when it stopped; counted,
            # so that every sampled frame is compared or skipped
            left = len(self._jobs)
            self._jobs.clear()
            for _ in range(left):
                self.counts.skipped_behind += 1
                self.stats.skip()
            self.store.close()

    # -- one frame ---------------------------------------------------------------------
    def run(self, decision: Decision, data: np.ndarray, is_image: bool) -> ShadowRow | None:
        """Run the candidate on one frame, compare, store and count (on the calling
        thread); the row (queued for the store's next commit), or None when skipped or
        failed (counted)."""
        pool = self.pool
        if pool.busy():
            self._skip_busy()
            return None
        cand = self.candidate
        t0 = time.perf_counter_ns()
        try:
            req = (
                pool.submit(cand.model, frame=data, t0_ns=t0, priority=Priority.BACKGROUND)
                if is_image
                else pool.submit(cand.model, data, t0_ns=t0, priority=Priority.BACKGROUND)
            )
        except Overloaded:
            self._skip_busy()
            return None
        except EdgeRuntimeError as e:
            self._error(str(e))
            return None
        frame_hw = (int(data.shape[0]), int(data.shape[1])) if is_image else (0, 0)
        try:
            with req:
                req.wait(self.wait_timeout_s)
                shadow_ms = (req.t_complete_ns - req.t_dispatch_ns) / 1e6
                result = cand.post(req.outputs, frame_hw, cand.input_hw)
            items = result_items(result)
            outputs: dict[str, Any] = dict(result.summary)
            if is_image:
                outputs["frame"] = {"width": frame_hw[1], "height": frame_hw[0]}
            if len(self.live_stages) > 1 and is_image:
                items, crops = run_chain(
                    pool,
                    self.live_stages[1],
                    data,
                    result,
                    t0,
                    deadline_s=None,
                    wait_timeout_s=self.wait_timeout_s,
                    priority=Priority.BACKGROUND,
                )
                outputs["crops"] = crops
        except Overloaded:
            self._skip_busy()
            return None
        except EdgeRuntimeError as e:
            self._error(str(e))
            return None
        verdict = decide(self.policy, items)
        live_outcome = decision.verdict.outcome
        c = compare(decision.result, live_outcome, result, verdict.outcome, self.iou_threshold)
        rec = decision.record
        live_ms = float(rec.latencies_ms.get("inference", 0.0))
        row = ShadowRow(
            decision_id=rec.id or new_id(rec.decision_time),
            ts=time.time(),
            source=rec.source,
            line=rec.line,
            live_model=rec.model_name,
            live_version=rec.model_version,
            live_outcome=live_outcome,
            live_ms=round(live_ms, 3),
            live_outputs=rec.outputs,
            shadow_model=self.key.bundle,
            shadow_version=self.key.version,
            shadow_release=self.key.release,
            shadow_digest=self.key.digest,
            shadow_outcome=verdict.outcome,
            shadow_ms=round(shadow_ms, 3),
            shadow_outputs=outputs,
            agree=c.agree,
            iou_threshold=self.iou_threshold,
            matched=c.boxes.matched,
            unmatched_live=c.boxes.unmatched_live,
            unmatched_shadow=c.boxes.unmatched_shadow,
        )
        self.store.write(row, data if is_image and not c.agree else None)
        self.stats.record(c, shadow_ms, live_ms)
        self.counts.compared += 1
        self.counts.agreed += int(c.agree)
        return row

    def _skip_busy(self) -> None:
        self.counts.skipped_busy += 1
        self.stats.skip()

    def _error(self, message: str) -> None:
        self.counts.errors += 1
        self.counts.last_error = message
        self.stats.error()
        if self.counts.errors % _LOG_EVERY == 1:
            log.warning(
                "shadow of pipeline %s: %s (%d errors so far)",
                self.pipeline,
                message,
                self.counts.errors,
            )
