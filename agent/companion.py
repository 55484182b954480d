"""The companion: everything of the agent that is not the hot path. The uplink (outbox,
decision batches, health, MQTT), the directives service and the installer, the local
HTTP endpoint (``/healthz``, ``/readyz``, ``/metrics``) and their gauges.

It reaches the hot path through a :class:`agent.control.link.HotPathLink` only, and the
decision log through SQLite (WAL: a reader never blocks the writer). In two processes
(:mod:`agent.supervisor`) a watcher thread polls the hot path once a second: it takes the
alarms the hot path's parts raised and reports them to the fleet, and it reports a hot
path that was restarted (a ``crash`` event, once per start: its id is the start's boot id).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from agent.config import AgentConfig
from agent.control.link import HotPathLink
from agent.control.protocol import ControlError
from agent.decisionlog import DecisionLog
from agent.decisionlog.marks import UploadMarks
from agent.http import LocalHttpServer
from agent.installer import Installer
from agent.kernel import signals
from agent.kernel.errors import EdgefleetError
from agent.metrics import AgentMetrics
from agent.planning import Problem
from agent.remote.service import Controls
from agent.status import GaugeThread, problem_lines, update_upstream_gauges, upstream_health
from agent.upstream import Upstream
from runtime.profiles import load_profile

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0
"""How often the watcher asks the hot path for its status and alarms."""


class Companion:
    """The companion of one agent. ``start()``, then ``stop()``.

    Args:
        config: the agent's configuration.
        link: the hot path.
        metrics: where the companion's parts count.
        http: serve the local HTTP endpoint.
        decision_log: the log the uplink uploads from (in one process, the hot path's;
            default: :class:`UploadMarks` on the same file).
        installer: the installer the directives service applies directives with (None:
            no directives service).
        split: the hot path runs in another process: watch it (alarms, restarts), and
            join its metrics to the companion's on ``/metrics``.
        config_path: the configuration file (a remote reload reads and checks it).
        supervisor_pid: the supervisor of ``edge-agent run``, which a remote restart or
            reload asks (:data:`agent.kernel.signals.RESTART`, ``RECONFIGURE``); None:
            this agent can't restart itself.
    """

    def __init__(
        self,
        config: AgentConfig,
        link: HotPathLink,
        *,
        metrics: AgentMetrics | None = None,
        http: bool = True,
        decision_log: DecisionLog | UploadMarks | None = None,
        installer: Installer | None = None,
        split: bool = True,
        problems: list[Problem] | None = None,
        config_path: Path | None = None,
        supervisor_pid: int | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.supervisor_pid = supervisor_pid
        self.link = link
        self.metrics = metrics or AgentMetrics()
        self.problems: list[Problem] = problems if problems is not None else []
        self.split = split
        self.state_dir: Path = config.agent.state_dir
        self.profile_name = load_profile(config.agent.profile).name
        self.decision_log = decision_log or UploadMarks(self.state_dir, config.decision_log)
        self.installer = installer
        self.upstream = Upstream(config, metrics=self.metrics, problems=self.problems)
        self.http: LocalHttpServer | None = None
        self._want_http = http
        self._stop = threading.Event()
        self._gauges = GaugeThread(self.update_gauges, self._stop)
        self._watcher = threading.Thread(target=self._watch, name="hotpath-watch", daemon=True)
        self._status: dict[str, Any] = {}
        self._status_at = 0.0
        self._boot_seen: str | None = None
        self.hotpath_restarts_seen = 0

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> Companion:
        if self._want_http:
            h = self.config.http
            self.http = LocalHttpServer(
                h.host,
                h.port,
                self.metrics,
                health=self.health,
                ready=self.ready,
                allow_remote=h.allow_remote,
                render=self.render_metrics,
            )
            self.http.start()
        self.upstream.start(
            self.link,
            decision_log=self.decision_log,  # type: ignore[arg-type] # the uplink's calls only
            installer=self.installer,
            profile_name=self.profile_name,
            health=self._fleet_health,
            worker_pids=self._worker_pids,
            load=self.link.live,
            controls=self.controls(),
        )
        self._gauges.start()
        if self.split:
            self._watcher.start()
        return self

    def controls(self) -> Controls:
        """What the remote actions service may ask of this agent."""
        pid = self.supervisor_pid

        def ask(signum: int) -> None:
            if pid is None:
                raise OSError("no supervisor")
            os.kill(pid, signum)

        return Controls(
            health=lambda: self.health()[1],
            ready=lambda: self.ready()[1],
            hello=lambda: dict(self.link.status().get("hello") or {}),
            restart=None if pid is None else lambda: ask(signals.RESTART),
            reload=None if pid is None else lambda: ask(signals.RECONFIGURE),
            config_path=self.config_path,
            config_digest=self.config.digest(),
        )

    def stop(self, timeout_s: float = 1.0) -> None:
        self._stop.set()
        self.upstream.stop(timeout_s=timeout_s)
        if self._watcher.is_alive():
            self._watcher.join(timeout_s)
        if isinstance(self.decision_log, UploadMarks):
            self.decision_log.close()
        if self.http is not None:
            self.http.stop()

    # -- what it serves -------------------------------------------------------------
    def health(self) -> tuple[bool, dict[str, Any]]:
        """Alive: the hot path answers and is alive (its pool has workers, its decision
        log writer runs); with the uplink's and the last install's details."""
        try:
            ok, details = self.link.health()
        except ControlError as exc:
            ok, details = False, {"hotpath": f"not answering: {exc.reason}"}
        details = dict(details)
        details.update(upstream_health(self.upstream))
        if self.upstream.remote is not None:
            details["remote"] = self.upstream.remote.health()
        if self.split:  # in one process the two parts share one list of problems
            hot = details.get("problems")
            details["problems"] = [
                *(hot if isinstance(hot, list) else []),
                *problem_lines(self.problems),
            ]
            hello = self._status.get("hello") or {}
            details["hotpath_process"] = {
                "pid": hello.get("pid"),
                "starts": hello.get("starts"),
                "last_exit": hello.get("last_exit"),
            }
        return ok, details

    def ready(self) -> tuple[bool, dict[str, Any]]:
        try:
            return self.link.ready()
        except ControlError as exc:
            return False, {"hotpath": f"not answering: {exc.reason}"}

    def render_metrics(self) -> bytes:
        """The hot path's families and the companion's (in one process, one registry)."""
        if not self.split:
            return self.metrics.render()
        try:
            hot = self.link.metrics().encode("utf-8")
        except ControlError as exc:
            log.warning("metrics: the hot path's part is missing: %s", exc.reason)
            hot = b""
        return hot + self.metrics.render_part("companion")

    def update_gauges(self) -> None:
        update_upstream_gauges(self.metrics, self.upstream)

    # -- the hot path, as the uplink reports it ---------------------------------------
    def _fresh_status(self) -> dict[str, Any]:
        if time.monotonic() - self._status_at > 2 * WATCH_INTERVAL_S:
            self._poll_status()
        return self._status

    def _poll_status(self) -> None:
        self._status = self.link.status()
        self._status_at = time.monotonic()

    def _fleet_health(self) -> dict[str, Any]:
        status = self._fresh_status()
        return dict(status.get("fleet_health") or {})

    def _worker_pids(self) -> list[int]:
        try:
            status = self._fresh_status()
        except ControlError:
            return []
        return [int(p) for p in status.get("worker_pids") or []]

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL_S):
            try:
                self._poll_status()
                self._report_restart(self._status.get("hello") or {})
                for alarm in self.link.alarms():
                    self.upstream.alarm(alarm["alarm"], alarm["message"])
            except ControlError as exc:
                log.debug("hot path not answering: %s", exc.reason)
            except Exception:  # the watcher outlives one bad round: log and go on
                log.exception("watching the hot path failed")

    def _report_restart(self, hello: dict[str, Any]) -> None:
        boot = hello.get("boot")
        if not isinstance(boot, str) or boot == self._boot_seen:
            return
        self._boot_seen = boot
        starts = int(hello.get("starts") or 1)
        if starts <= 1:
            return
        self.hotpath_restarts_seen += 1
        payload = {
            "process": "hotpath",
            "starts": starts,
            "last_exit": str(hello.get("last_exit") or ""),
            "pid": hello.get("pid"),
        }
        log.warning("the hot path was restarted (start %d; %s)", starts, payload["last_exit"])
        uplink = self.upstream.uplink
        if uplink is None:
            return
        try:
            uplink.event("crash", payload, event_id=f"crash-hotpath-{boot}")
        except EdgefleetError as exc:
            log.error("hot path restart not reported: %s", exc)  # noqa: TRY400
