"""The cluster bench's light agents as a group of spawned processes
(:func:`hil.bench.cluster_agents.run_agents` in each): start, wait until connected,
start beating, stop and collect what each saw. Leaving the ``with`` block ends every
process, also on a failure."""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
from types import TracebackType
from typing import Any

from hil.bench.cluster_agents import CONNECT_TIMEOUT_S, DRAIN_TIMEOUT_S, run_agents

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 30.0
NO_REPORT: dict[str, Any] = {
    "acked": {}, "directives": {}, "refused": 0, "unacked": 0, "installs": 0,
    "failures": ["a process did not report"],
}  # fmt: skip


class AgentFleet:
    """``where`` (device id -> (host, port) of its shard) split over processes of
    ``per_process`` agents each."""

    def __init__(
        self, where: dict[str, tuple[str, int]], spec: dict[str, Any], per_process: int
    ) -> None:
        ids = sorted(where)
        n = max(1, -(-len(ids) // max(1, per_process)))
        self._ctx = mp.get_context("spawn")
        self._results: Any = self._ctx.Queue(maxsize=4 * n)
        self._go = self._ctx.Event()
        self._stop = self._ctx.Event()
        self._specs = [spec | {"devices": {d: where[d] for d in ids[k::n]}} for k in range(n)]
        self._procs: list[Any] = []

    def __enter__(self) -> AgentFleet:
        for spec in self._specs:
            p = self._ctx.Process(
                target=run_agents, args=(spec, self._results, self._go, self._stop), daemon=True
            )
            p.start()
            self._procs.append(p)
        return self

    def connect(self) -> tuple[int, list[str]]:
        """(agents connected, a few failures) once every process has reported."""
        ready, failures = 0, []
        for _ in self._procs:
            try:
                hello = self._results.get(timeout=CONNECT_TIMEOUT_S + 60)
            except queue.Empty:
                failures.append("a process did not report within the connect timeout")
                break
            ready += hello["ready"]
            failures += hello["failures"]
        return ready, failures[:5]

    def go(self) -> None:
        """Start the heartbeats."""
        self._go.set()

    def stop(self) -> list[dict[str, Any]]:
        """Stop beating, drain the acknowledgements; each process's report."""
        self._stop.set()
        reports = []
        for _ in self._procs:
            try:
                reports.append(self._results.get(timeout=DRAIN_TIMEOUT_S + 60))
            except queue.Empty:
                log.exception("an agent process did not report")
                reports.append(NO_REPORT)
        return reports

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        for _ in range(4 * len(self._procs)):  # a child ends only once its puts are read
            try:
                self._results.get(timeout=1.0)
            except queue.Empty:
                break
        for p in self._procs:
            p.join(JOIN_TIMEOUT_S)
            if p.is_alive():
                p.kill()
                p.join(JOIN_TIMEOUT_S)
