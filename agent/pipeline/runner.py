"""One pipeline's loop: take the newest input from its source, run the model (or chain)
on the runtime's pool, post-process, decide, and hand the decision on.

The loop never builds a backlog: it takes only the newest frame (the camera drops the
rest and counts them), keeps one frame in flight, and hashes the input while the worker
infers. Inference failures are counted per reason and the loop goes on.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from agent.decisionlog import DecisionRecord
from agent.kernel.bundle import Bundle
from agent.pipeline.postprocess import Result, build_postprocessor
from agent.policy import Item, PolicySpec, Verdict, decide
from runtime import EdgeRuntimeError, ModelInfo, WorkerPool

log = logging.getLogger(__name__)

MAX_SUMMARY_ITEMS = 20


class Input(Protocol):
    """A camera Frame or a SensorWindow: what a pipeline takes from its source."""

    @property
    def seq(self) -> int: ...
    @property
    def t_capture_ns(self) -> int: ...
    @property
    def wall_time(self) -> float: ...


class Source(Protocol):
    def latest(self, timeout_s: float) -> Any: ...


@dataclass
class Stage:
    """A bundle served by the pool under ``model``."""

    bundle: Bundle
    model: str
    info: ModelInfo
    post: Callable[[Sequence[np.ndarray], tuple[int, int], tuple[int, int]], Result]
    input_hw: tuple[int, int]
    max_crops: int = 1
    padding: float = 0.0

    @classmethod
    def build(cls, bundle: Bundle, model: str, pool: WorkerPool, **kw: Any) -> Stage:
        info = pool.info(model)
        pre = bundle.manifest.preprocess
        input_hw = (int(pre.height), int(pre.width)) if pre is not None else (0, 0)
        post = build_postprocessor(bundle.manifest.postprocess, [o.name for o in info.outputs])
        return cls(bundle, model, info, post, input_hw, **kw)

    @property
    def backend(self) -> str:
        provider = self.info.providers[0] if self.info.providers else ""
        return f"{self.info.backend}/{provider}" if provider else self.info.backend


@dataclass(frozen=True)
class Decision:
    """A decided input, as the pipeline hands it on (to the log, actions, the console)."""

    record: DecisionRecord
    verdict: Verdict
    result: Result
    t_capture_ns: int


@dataclass
class PipelineStats:
    taken: int = 0
    decided: int = 0
    errors: int = 0
    last_error: str = ""


def _items(result: Result) -> list[Item]:
    if result.kind == "detection":
        return [Item(d.label, d.score) for d in result.detections]
    return [Item(result.label, result.score)]


def _crop(image: np.ndarray, box: tuple[float, float, float, float], pad: float) -> np.ndarray:
    h, w = image.shape[:2]
    x1, y1, x2, y2 = box
    px, py = (x2 - x1) * pad, (y2 - y1) * pad
    xa, ya = max(0, int(x1 - px)), max(0, int(y1 - py))
    xb, yb = min(w, int(np.ceil(x2 + px))), min(h, int(np.ceil(y2 + py)))
    return image[ya:yb, xa:xb]


class PipelineRunner:
    """Runs one pipeline on its own thread until stopped."""

    def __init__(
        self,
        name: str,
        *,
        source_name: str,
        line: str,
        source: Source,
        pool: WorkerPool,
        stages: Sequence[Stage],
        policy: PolicySpec,
        config_hash: str,
        emit: Callable[[Decision], None],
        on_error: Callable[[str, str], None] | None = None,
        deadline_s: float | None = None,
        wait_timeout_s: float = 10.0,
    ) -> None:
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        self.name = name
        self.source_name = source_name
        self.line = line
        self.source = source
        self.pool = pool
        self.stages = list(stages)
        self.policy = policy
        self.config_hash = config_hash
        self.emit = emit
        self.on_error = on_error
        self.deadline_s = deadline_s
        self.wait_timeout_s = wait_timeout_s
        self.stats = PipelineStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- thread --------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name=f"pipeline-{self.name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout_s: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            item = self.source.latest(timeout_s=0.2)
            if item is None:
                continue
            self.stats.taken += 1
            try:
                decision = self.process(item)
            except EdgeRuntimeError as e:
                self._error(type(e).__name__, str(e))
                continue
            except Exception as e:  # a bug must not kill the line: log, count, go on
                log.exception("pipeline %s: unexpected error", self.name)
                self._error("internal", f"{type(e).__name__}: {e}")
                continue
            self.stats.decided += 1
            self.emit(decision)

    def _error(self, reason: str, message: str) -> None:
        self.stats.errors += 1
        self.stats.last_error = message
        if self.on_error is not None:
            self.on_error(reason, message)

    # -- one input -----------------------------------------------------------------
    def process(self, item: Any) -> Decision:
        """Decide one frame or sensor window. Raises EdgeRuntimeError on inference failure."""
        t_take = time.perf_counter_ns()
        image = getattr(item, "image", None)
        data: np.ndarray = image if image is not None else item.values
        is_image = image is not None
        first = self.stages[0]
        t0 = item.t_capture_ns
        req = (
            self.pool.submit(first.model, frame=data, t0_ns=t0, deadline_s=self.deadline_s)
            if is_image
            else self.pool.submit(first.model, data, t0_ns=t0, deadline_s=self.deadline_s)
        )
        with req:
            digest = hashlib.sha256(np.ascontiguousarray(data).data).hexdigest()[:32]
            req.wait(self.wait_timeout_s)
            t_inferred = time.perf_counter_ns()
            frame_hw = (int(data.shape[0]), int(data.shape[1])) if is_image else (0, 0)
            result = first.post(req.outputs, frame_hw, first.input_hw)
            queue_ns = req.t_dispatch_ns - req.t_submit_ns
            infer_ns = req.t_complete_ns - req.t_dispatch_ns
        t_post = time.perf_counter_ns()
        items = _items(result)
        summary: dict[str, Any] = dict(result.summary)
        if is_image:  # boxes are in frame pixels: the review pages scale them to a thumbnail
            summary["frame"] = {"width": frame_hw[1], "height": frame_hw[0]}
        lat = {
            "capture_wait": (t_take - t0) / 1e6,
            "queue": queue_ns / 1e6,
            "inference": infer_ns / 1e6,
            "postprocess": (t_post - t_inferred) / 1e6,
        }
        if len(self.stages) > 1 and is_image:
            items, crops = self._chain(data, result, t0)
            summary["crops"] = crops[:MAX_SUMMARY_ITEMS]
            summary["chain"] = [
                {
                    "model": s.bundle.manifest.name,
                    "version": s.bundle.manifest.version,
                    "bundle_digest": s.bundle.digest,
                    "backend": s.backend,
                }
                for s in self.stages[1:]
            ]
            lat["chain"] = (time.perf_counter_ns() - t_post) / 1e6
        t_policy = time.perf_counter_ns()
        verdict = decide(self.policy, items)
        t_done = time.perf_counter_ns()
        lat["policy"] = (t_done - t_policy) / 1e6
        lat["e2e"] = (t_done - t0) / 1e6
        now = time.time()
        record = DecisionRecord(
            capture_time=item.wall_time,
            decision_time=now,
            source=self.source_name,
            line=self.line,
            model_name=first.bundle.manifest.name,
            model_version=first.bundle.manifest.version,
            bundle_digest=first.bundle.digest,
            backend=first.backend,
            config_hash=self.config_hash,
            input_digest=digest,
            outputs=summary,
            outcome=verdict.outcome,
            thresholds=verdict.thresholds(self.policy),
            latencies_ms=lat,
            thumbnail=image if is_image else None,
        )
        return Decision(record, verdict, result, t0)

    def _chain(
        self, image: np.ndarray, result: Result, t0: int
    ) -> tuple[list[Item], list[dict[str, Any]]]:
        """Run the next stage on each detection's crop; one item per classified crop."""
        stage = self.stages[1]
        boxes = [d.box for d in result.detections[: stage.max_crops]]
        pending = []
        for box in boxes:
            crop = _crop(image, box, stage.padding)
            if crop.shape[0] < 2 or crop.shape[1] < 2:
                continue
            req = self.pool.submit(stage.model, frame=crop, t0_ns=t0, deadline_s=self.deadline_s)
            pending.append((box, crop.shape[:2], req))
        items: list[Item] = []
        crops: list[dict[str, Any]] = []
        try:
            for box, hw, req in pending:
                req.wait(self.wait_timeout_s)
                sub = stage.post(req.outputs, (int(hw[0]), int(hw[1])), stage.input_hw)
                req.release()
                items.append(Item(sub.label, sub.score))
                crops.append(
                    {
                        "box": [round(v, 1) for v in box],
                        "label": sub.label,
                        "score": round(sub.score, 4),
                    }
                )
        finally:
            for _, _, req in pending:
                req.release()
        return items, crops
