"""One pipeline: take the newest input from its source, run the model (or chain) on the
runtime's pool, post-process, decide, and hand the decision on.

The pipeline never builds a backlog: it takes only the newest frame (the camera drops the
rest and counts them) and keeps at most ``in_flight`` frames between taking and deciding
(ADR 0009). Two threads share the work: the *feeder* takes a frame as soon as one of
those places is free, submits it to the pool and hashes it while a worker infers; the
*decider* waits for the oldest frame in flight, post-processes it, decides and hands the
decision on. Frames are decided in the order they were taken, which is capture order, so
one camera's decisions are emitted in capture order whatever worker finishes first.
With ``in_flight = 1`` this is the one-frame-in-flight loop of ADR 0002. Inference
failures are counted per reason and the pipeline goes on.

A pipeline may carry a *shadow* hook (:mod:`agent.shadow`): the decider calls it with
each decision and its input only after the decision was handed on, and the hook only
offers the frame to the shadow's own thread (O(1), never waits), so a candidate never
acts and never delays the live path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import xxhash

from agent.decisionlog import DecisionRecord
from agent.kernel.bundle import Bundle
from agent.pipeline.postprocess import Result, build_postprocessor
from agent.pipeline.stages import StageTimes
from agent.policy import Item, PolicySpec, Verdict, decide
from runtime import EdgeRuntimeError, ModelInfo, Priority, Request, WorkerPool

log = logging.getLogger(__name__)

MAX_SUMMARY_ITEMS = 20
MAX_IN_FLIGHT = 8
"""The most frames one pipeline may keep between taking and deciding."""

_POLL_S = 0.2  # how often a waiting thread looks at the stop flag
STALL_MARGIN_S = 5.0
"""Added to the longest wait a pipeline's loop may legitimately make before it counts as
wedged (:meth:`PipelineRunner.liveness`)."""


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
    trigger: Any = None
    """The station's trigger this decision answers (:class:`agent.line.handshake.Trigger`),
    None for a free-running pipeline."""


ShadowHook = Callable[["Decision", np.ndarray, bool], None]
"""Called on the decider thread after a decision was emitted: ``(decision, input,
is_image)``. Must return at once (see :meth:`agent.shadow.runner.ShadowRunner.offer`)."""


@dataclass
class PipelineStats:
    """A pipeline's counters; ``in_flight`` is how many frames it holds now."""

    taken: int = 0
    decided: int = 0
    errors: int = 0
    last_error: str = ""
    in_flight: int = 0
    max_in_flight: int = 1


@dataclass
class _Pending:
    """A frame submitted to the pool, waiting to be decided."""

    item: Any
    data: np.ndarray
    is_image: bool
    req: Request
    digest: str
    t_take_ns: int
    t_submitted_ns: int


DIGEST_PREFIX = "xxh3:"
"""The input digest's algorithm, named in the value (ADR 0024); a digest without a prefix
is an older agent's: the first 32 hex digits of the input's sha256."""


def input_digest(data: np.ndarray) -> str:
    """The input's identity in the decision log: ``xxh3:`` and XXH3's 128-bit hash in hex
    (20 µs for a 640x480 frame where sha256 took 500 µs; it names an input, it does not
    sign one, ADR 0024)."""
    return DIGEST_PREFIX + xxhash.xxh3_128_hexdigest(np.ascontiguousarray(data).data)


def result_items(result: Result) -> list[Item]:
    """The policy's evidence from one stage's result: a detection's every box, else the
    one label and score."""
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
    """Runs one pipeline on its feeder and decider threads until stopped.

    ``in_flight`` (1..:data:`MAX_IN_FLIGHT`) is how many frames may be between taking
    and deciding; one per pool worker lets one camera keep every worker busy.
    """

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
        in_flight: int = 1,
        shadow: ShadowHook | None = None,
    ) -> None:
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        if not 1 <= in_flight <= MAX_IN_FLIGHT:
            raise ValueError(f"in_flight must be 1..{MAX_IN_FLIGHT}, got {in_flight}")
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
        self.in_flight = in_flight
        self.shadow = shadow
        """Offered each decision after it was emitted (see :data:`ShadowHook`)."""
        self.stats = PipelineStats(max_in_flight=in_flight)
        self.stage_times: StageTimes | None = None
        """Per-stage histograms while :meth:`measure_stages` is on (benches); None off."""
        self._rules = [r.model_dump(exclude_none=True) for r in policy.rules]
        self._stop = threading.Event()
        self._places = threading.Semaphore(in_flight)
        self._pending: deque[_Pending] = deque()
        self._cond = threading.Condition()
        self._fed_all = threading.Event()
        self._errors_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.beat_at = time.monotonic()
        """When the loop last went round (monotonic): the feeder got a free place, or the
        decider finished a frame. An idle source still beats; a wedged loop does not."""

    # -- threads ---------------------------------------------------------------------
    def start(self) -> None:
        self._fed_all.clear()
        self.beat_at = time.monotonic()
        self._threads = [
            threading.Thread(target=self._feed, name=f"pipeline-{self.name}", daemon=True),
            threading.Thread(target=self._decide, name=f"pipeline-{self.name}-decide", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Take no more frames; the frames in flight are still decided and emitted."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    def join(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    @property
    def stall_s(self) -> float:
        """How long the loop may go without a beat before it counts as wedged: the longest
        wait for one frame's inferences (the first stage and every crop of a chain), plus
        :data:`STALL_MARGIN_S`."""
        waits = 1 + sum(s.max_crops for s in self.stages[1:])
        return self.wait_timeout_s * waits + 2 * _POLL_S + STALL_MARGIN_S

    def liveness(self) -> dict[str, Any]:
        """The loop's heartbeat: ``loop_age_s`` since its last beat, ``stall_s``, whether
        its threads run, and ``wedged`` (a thread died, or no beat for ``stall_s``, while
        not stopping)."""
        age = time.monotonic() - self.beat_at
        threads = bool(self._threads) and all(t.is_alive() for t in self._threads)
        stopping = self._stop.is_set()
        return {
            "loop_age_s": round(age, 3),
            "stall_s": self.stall_s,
            "threads_alive": threads,
            "wedged": not stopping and (not threads or age > self.stall_s),
        }

    def measure_stages(self, on: bool = True) -> StageTimes | None:
        """Keep per-stage histograms (from now, or no more); they cost a few µs a stage."""
        self.stage_times = StageTimes() if on else None
        return self.stage_times

    def _feed(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._places.acquire(timeout=_POLL_S):
                    continue
                self.beat_at = time.monotonic()
                item = self.source.latest(timeout_s=_POLL_S)
                if item is None or self._stop.is_set():
                    self._places.release()
                    give_back = getattr(self.source, "give_back", None)
                    if item is not None and give_back is not None:
                        give_back(item)  # a triggered frame: the next runner decides it
                    continue
                self.stats.taken += 1
                try:
                    pending = self._submit(item)
                except EdgeRuntimeError as e:
                    self._places.release()
                    self._error(type(e).__name__, str(e))
                    continue
                except Exception as e:  # a bug must not kill the line: log, count, go on
                    self._places.release()
                    log.exception("pipeline %s: unexpected error", self.name)
                    self._error("internal", f"{type(e).__name__}: {e}")
                    continue
                with self._cond:
                    self._pending.append(pending)
                    self.stats.in_flight = len(self._pending)
                    self._cond.notify()
        finally:
            self._fed_all.set()
            with self._cond:
                self._cond.notify_all()

    def _decide(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    if self._fed_all.is_set():
                        return
                    self._cond.wait(_POLL_S)
                pending = self._pending[0]  # oldest first: capture order
            try:
                decision = self._finish(pending)
            except EdgeRuntimeError as e:
                self._error(type(e).__name__, str(e))
                decision = None
            except Exception as e:  # a bug must not kill the line: log, count, go on
                log.exception("pipeline %s: unexpected error", self.name)
                self._error("internal", f"{type(e).__name__}: {e}")
                decision = None
            try:
                if decision is not None:
                    self.stats.decided += 1
                    self._emit(decision)
                    if self.shadow is not None:
                        self._offer_shadow(decision, pending)
            finally:
                with self._cond:
                    self._pending.popleft()
                    self.stats.in_flight = len(self._pending)
                self._places.release()
                self.beat_at = time.monotonic()

    def _emit(self, decision: Decision) -> None:
        times = self.stage_times
        if times is None:
            self.emit(decision)
            return
        t = time.perf_counter_ns()
        self.emit(decision)
        done = time.perf_counter_ns()
        times.record("emit", done - t)
        times.record("e2e", done - decision.t_capture_ns)

    def _offer_shadow(self, decision: Decision, p: _Pending) -> None:
        """Offer the emitted decision to the shadow; its failure is the shadow's, never the
        line's: logged, and the pipeline goes on."""
        shadow = self.shadow
        if shadow is None:
            return
        try:
            shadow(decision, p.data, p.is_image)
        except Exception:
            log.exception("pipeline %s: the shadow hook failed", self.name)

    def _error(self, reason: str, message: str) -> None:
        with self._errors_lock:
            self.stats.errors += 1
            self.stats.last_error = message
        if self.on_error is not None:
            self.on_error(reason, message)

    # -- one input -----------------------------------------------------------------
    def process(self, item: Any) -> Decision:
        """Decide one frame or sensor window, on the caller's thread.

        Raises:
            EdgeRuntimeError: the inference failed.
        """
        return self._finish(self._submit(item))

    def _submit(self, item: Any) -> _Pending:
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
        t_submitted = time.perf_counter_ns()
        try:  # the worker infers meanwhile
            digest = input_digest(data)
        except BaseException:
            req.release()
            raise
        times = self.stage_times
        if times is not None:
            times.record("take", t_take - t0)
            times.record("submit", t_submitted - t_take)
            times.record("digest", time.perf_counter_ns() - t_submitted)
        return _Pending(item, data, is_image, req, digest, t_take, t_submitted)

    def _finish(self, p: _Pending) -> Decision:
        """Wait for ``p``'s inference, post-process, decide and build the record."""
        item, data, is_image = p.item, p.data, p.is_image
        first = self.stages[0]
        t0 = item.t_capture_ns
        with p.req as req:
            req.wait(self.wait_timeout_s)
            t_inferred = time.perf_counter_ns()
            frame_hw = (int(data.shape[0]), int(data.shape[1])) if is_image else (0, 0)
            result = first.post(req.outputs, frame_hw, first.input_hw)
            queue_ns = req.t_dispatch_ns - req.t_submit_ns
            infer_ns = req.t_complete_ns - req.t_dispatch_ns
        t_post = time.perf_counter_ns()
        items = result_items(result)
        summary: dict[str, Any] = dict(result.summary)
        if is_image:  # boxes are in frame pixels: the review pages scale them to a thumbnail
            summary["frame"] = {"width": frame_hw[1], "height": frame_hw[0]}
        lat = {
            "capture_wait": (p.t_take_ns - t0) / 1e6,
            "queue": queue_ns / 1e6,
            "inference": infer_ns / 1e6,
            "postprocess": (t_post - t_inferred) / 1e6,
        }
        if len(self.stages) > 1 and is_image:
            items, crops = run_chain(
                self.pool,
                self.stages[1],
                data,
                result,
                t0,
                deadline_s=self.deadline_s,
                wait_timeout_s=self.wait_timeout_s,
            )
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
        rule = verdict.rule  # the rules' dump is made once (what Verdict.thresholds gives)
        trigger = getattr(item, "trigger", None)
        clock = getattr(item, "clock", "host")
        if trigger is not None or clock != "host":
            summary["capture"] = capture_note(clock, t0, trigger)
        record = DecisionRecord(
            capture_time=item.wall_time,
            decision_time=time.time(),
            source=self.source_name,
            line=self.line,
            model_name=first.bundle.manifest.name,
            model_version=first.bundle.manifest.version,
            bundle_digest=first.bundle.digest,
            backend=first.backend,
            config_hash=self.config_hash,
            input_digest=p.digest,
            outputs=summary,
            outcome=verdict.outcome,
            thresholds={"rules": self._rules, "default": self.policy.default, "fired": rule},
            latencies_ms=lat,
            thumbnail=data if is_image else None,
            station=trigger.station if trigger is not None else "",
            part_id=trigger.part_id if trigger is not None else "",
        )
        times = self.stage_times
        if times is not None:
            times.record("wait", t_inferred - p.t_submitted_ns)
            times.record("postprocess", t_post - t_inferred)
            times.record("policy", t_done - t_policy)
            times.record("record", time.perf_counter_ns() - t_done)
        return Decision(record, verdict, result, t0, trigger)


def capture_note(clock: str, t_capture_ns: int, trigger: Any) -> dict[str, Any]:
    """What the record says of its capture time (``outputs["capture"]``): which clock it
    is on (:attr:`agent.capture.frame.Frame.clock`: ``camera`` is the camera's own
    timestamp mapped to the host clock) and, for a station's decision, how long after the
    station saw the trigger the frame was taken (``after_trigger_ms``; negative for a
    hardware-triggered camera that exposed before the PLC's trigger reached the agent)."""
    note: dict[str, Any] = {"clock": clock}
    if trigger is not None:
        note["after_trigger_ms"] = round((t_capture_ns - trigger.t_ns) / 1e6, 3)
    return note


def run_chain(
    pool: WorkerPool,
    stage: Stage,
    image: np.ndarray,
    result: Result,
    t0: int,
    *,
    deadline_s: float | None,
    wait_timeout_s: float,
    priority: Priority = Priority.CONTROL,
) -> tuple[list[Item], list[dict[str, Any]]]:
    """Run ``stage`` on each detection's crop (at most its ``max_crops``), at ``priority``;
    one item per classified crop, and the crops' summaries.

    Raises:
        EdgeRuntimeError: an inference failed or timed out.
    """
    boxes = [d.box for d in result.detections[: stage.max_crops]]
    pending = []
    try:
        for box in boxes:
            crop = _crop(image, box, stage.padding)
            if crop.shape[0] < 2 or crop.shape[1] < 2:
                continue
            req = pool.submit(
                stage.model, frame=crop, t0_ns=t0, deadline_s=deadline_s, priority=priority
            )
            pending.append((box, crop.shape[:2], req))
        items: list[Item] = []
        crops: list[dict[str, Any]] = []
        for box, hw, req in pending:
            req.wait(wait_timeout_s)
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
