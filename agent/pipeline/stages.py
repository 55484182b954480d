"""Where a pipeline's time goes: one latency histogram per stage of its work.

Kept only while asked for (:meth:`agent.pipeline.runner.PipelineRunner.measure_stages`,
which ``edge-agent bench`` uses): each record costs a few microseconds on the hot path.
The stages, in the order a frame meets them:

- ``take``: capture timestamp to the pipeline taking the frame;
- ``submit``: handing the frame to the pool (the copy into its shared-memory slot);
- ``digest``: the input's sha256 (while a worker infers);
- ``wait``: submitted to inference done as the decider sees it (queue, the workers'
  hops, preprocessing, inference, and waiting behind an older frame in flight);
- ``postprocess``, ``policy``, ``record`` (building the decision record);
- ``emit``: handing the decision on (decision log append, actions, metrics, callbacks);
- ``e2e``: capture timestamp to the decision handed on.
"""

from __future__ import annotations

import threading

from hdrh.histogram import HdrHistogram

from runtime.metrics import new_histogram, summarize

STAGES = ("take", "submit", "digest", "wait", "postprocess", "policy", "record", "emit", "e2e")


class StageTimes:
    """One microsecond HDR histogram per stage. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hists: dict[str, HdrHistogram] = {s: new_histogram() for s in STAGES}

    def record(self, stage: str, ns: int) -> None:
        with self._lock:
            self._hists[stage].record_value(max(1, ns // 1000))

    def reset(self) -> None:
        with self._lock:
            for h in self._hists.values():
                h.reset()

    def summary(self) -> dict[str, dict[str, float]]:
        """count, p50, p95, p99, p99.9, max and mean of each stage that saw a value, in ms."""
        with self._lock:
            return {s: summarize(h) for s, h in self._hists.items() if h.get_total_count()}
