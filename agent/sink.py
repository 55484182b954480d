"""Where a pipeline's decision goes: the decision log, the actions, the metrics, the
outcome counts the fleet's rollout gates read, and the caller's own callback."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agent.actions.dispatcher import ActionDispatcher, ActionEvent
from agent.decisionlog import DecisionLog
from agent.decisionlog.record import new_id
from agent.livelatency import LatencyWindow
from agent.metrics import AgentMetrics
from agent.pipeline.runner import Decision


class DecisionSink:
    """Takes each decision of every pipeline (on the pipeline's thread)."""

    def __init__(
        self,
        log: DecisionLog,
        dispatcher: ActionDispatcher,
        metrics: AgentMetrics,
        *,
        pipeline_of: Callable[[str], str],
        on_decision: Callable[[Decision, str], None] | None = None,
        answer: Callable[[Decision], bool] | None = None,
    ) -> None:
        self.log = log
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.pipeline_of = pipeline_of
        self.on_decision = on_decision
        self.answer = answer
        """Hands a triggered decision to its station (which queues the PLC's writes)
        before it is logged; True when it came past the station's deadline."""
        self.outcome_counts: dict[str, int] = {}
        """Decisions by outcome since the bundles were last (re)loaded, for the fleet's
        outcome-shift gate."""
        self.first_decision_at: float | None = None
        """Monotonic time of the first decision since start (cold start figure)."""
        self.live = LatencyWindow()
        self._children: dict[tuple[str, str, str], Any] = {}
        """Each decision's e2e ms; ``live.snapshot`` paces the uplink's drain (``load=``)."""

    def _child(self, family: str, pipeline: str, label: str) -> Any:
        """A metric's labelled child, looked up once (``labels()`` costs more than the
        update itself on every decision)."""
        key = (family, pipeline, label)
        child = self._children.get(key)
        if child is None:
            m = self.metrics
            if family == "decisions":
                child = m.decisions.labels(pipeline=pipeline, outcome=label)
            elif family == "e2e":
                child = m.e2e_latency.labels(pipeline=pipeline)
            else:
                child = m.stage_latency.labels(pipeline=pipeline, stage=label)
            self._children[key] = child
        return child

    def reset_counts(self) -> None:
        """New bundles: outcomes are counted from zero."""
        self.outcome_counts = {}

    def emit(self, d: Decision) -> None:
        rec = d.record
        self.outcome_counts[rec.outcome] = self.outcome_counts.get(rec.outcome, 0) + 1
        if d.trigger is not None and self.answer is not None:
            # the PLC first: its result carries the decision id, so the id is made here
            rec.id = rec.id or new_id(rec.decision_time)
            rec.deadline_missed = self.answer(d)
        decision_id = self.log.append(rec)
        e2e_s = (time.perf_counter_ns() - d.t_capture_ns) / 1e9
        self.live.record(e2e_s * 1000.0)
        self.dispatcher.dispatch(
            ActionEvent(
                decision_id=decision_id,
                outcome=rec.outcome,
                source=rec.source,
                line=rec.line,
                capture_time=rec.capture_time,
                decision_time=rec.decision_time,
                model=rec.model_name,
                model_version=rec.model_version,
                score=d.result.score,
                label=d.result.label,
                summary=rec.outputs,
            )
        )
        pipeline = self.pipeline_of(rec.source)
        self._child("decisions", pipeline, rec.outcome).inc()
        self._child("e2e", pipeline, "").observe(e2e_s)
        for stage, ms in rec.latencies_ms.items():
            if stage != "e2e":
                self._child("stage", pipeline, stage).observe(ms / 1000)
        if self.first_decision_at is None:
            self.first_decision_at = time.monotonic()
        if self.on_decision is not None:
            self.on_decision(d, decision_id)
