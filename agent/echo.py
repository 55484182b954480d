"""``edge-agent run --echo``: one line per decision on stdout (printed by the hot path)."""

from __future__ import annotations

import time
from typing import Any


def echo_decision(decision: Any, decision_id: str) -> None:
    """``--echo``: one line per decision on stdout."""
    rec = decision.record
    e2e = rec.latencies_ms.get("e2e", 0.0)
    crops = rec.outputs.get("crops")
    if crops is not None:  # a chain: what the last stage said of each crop
        seen = " ".join(f"{c['label']}:{c['score']:.2f}" for c in crops) or "nothing"
    else:
        seen = f"{decision.result.label or '-'}:{decision.result.score:.3f}"
    print(
        f"{time.strftime('%H:%M:%S')} {rec.source:<8} {rec.outcome:<7} e2e {e2e:7.2f} ms  "
        f"{rec.model_name} {rec.model_version:<7} {decision_id[-12:]}  {seen}",
        flush=True,
    )
