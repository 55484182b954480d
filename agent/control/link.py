"""The companion's view of the hot path: :class:`HotPathLink` turns control operations
into typed calls, over any ``call(op, **args)``: :meth:`agent.hotpath.HotPath.handle` in
one process, :meth:`agent.control.client.ControlClient.call` across two.

It implements :class:`agent.directives.host.RunningAgent`, so the directives service
switches and probes the pipelines of a hot path in another process the way it does in
its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from agent.control.protocol import ControlError
from agent.installer.checks import BenchResult
from agent.installer.errors import InstallError
from agent.kernel.bundle import Bundle
from agent.livelatency import LiveLoad

RELOAD_TIMEOUT_S = 120.0
"""A reload loads models and starts workers: much longer than any other operation."""


class Call(Protocol):
    def __call__(self, op: str, *, timeout_s: float | None = None, **args: Any) -> Any: ...


def local_call(handle: Callable[[str, dict[str, Any]], Any]) -> Call:
    """``call`` for a hot path in this process (its ``handle``)."""

    def call(op: str, *, timeout_s: float | None = None, **args: Any) -> Any:
        return handle(op, args)

    return call


def _pair(value: Any, op: str) -> tuple[bool, dict[str, Any]]:
    if isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[1], dict):
        return bool(value[0]), value[1]
    raise ControlError(f"{op}: the answer is not [ok, details]")


class HotPathLink:
    """The hot path, as the companion calls it."""

    def __init__(
        self, call: Call, *, device_id: str, state_dir: Path, long_call: Call | None = None
    ) -> None:
        self._call = call
        self._long_call = long_call or call
        self._device_id = device_id
        self._state_dir = Path(state_dir)

    # -- RunningAgent -----------------------------------------------------------------
    @property
    def device_id(self) -> str:
        return self._device_id

    @property
    def state_dir(self) -> Path:
        return self._state_dir

    def reload(self) -> None:
        """Raises: ControlError: refused, or the hot path can't be reached."""
        self._long_call("reload", timeout_s=RELOAD_TIMEOUT_S)

    def reload_if_changed(self) -> bool:
        """Raises: ControlError: refused, or the hot path can't be reached."""
        return bool(self._long_call("reload_if_changed", timeout_s=RELOAD_TIMEOUT_S))

    def bundle_health(self, bundle: str) -> Mapping[str, float]:
        """Raises: RuntimeError: no running pipeline uses the bundle, or the hot path
        can't be reached (either is an unhealthy trial)."""
        try:
            answer = self._call("bundle_health", bundle=bundle)
        except ControlError as exc:
            raise RuntimeError(exc.reason) from exc
        if not isinstance(answer, dict):
            raise TypeError("bundle_health: the answer is not an object")
        return {str(k): float(v) for k, v in answer.items()}

    def trial(self, bundle: Bundle, runs: int, run_timeout_s: float) -> BenchResult:
        """The installer's load, warm-up and self-benchmark of a staged bundle, run by
        the hot path (:data:`agent.installer.installer.Measure`).

        Raises:
            InstallError: step "load" or "benchmark" (what the hot path found, or that
                it could not be asked).
        """
        name = bundle.manifest.name
        timeout_s = RELOAD_TIMEOUT_S + runs * run_timeout_s
        try:
            answer = self._long_call(
                "trial",
                timeout_s=timeout_s,
                bundle=str(bundle.path),
                runs=runs,
                timeout_ms=max(1, round(run_timeout_s * 1000)),
            )
        except ControlError as exc:
            why = f"the hot path did not run the trial: {exc.reason}"
            raise InstallError("load", why, name) from exc
        if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
            err = answer["error"]
            raise InstallError(str(err.get("step", "load")), str(err.get("reason", "")), name)
        bench = answer.get("bench") if isinstance(answer, dict) else None
        if not isinstance(bench, dict):
            raise InstallError("benchmark", "the hot path's trial answer has no figures", name)
        try:
            return BenchResult(**bench)
        except TypeError as exc:
            raise InstallError("benchmark", f"the hot path's figures: {exc}", name) from exc

    # -- status -------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """hello, health, ready, fleet_health and worker_pids in one round trip.

        Raises:
            ControlError: the hot path can't be reached.
        """
        answer = self._call("status")
        if not isinstance(answer, dict):
            raise ControlError("status: the answer is not an object")
        return answer

    def health(self) -> tuple[bool, dict[str, Any]]:
        return _pair(self._call("health"), "health")

    def ready(self) -> tuple[bool, dict[str, Any]]:
        return _pair(self._call("ready"), "ready")

    def stats(self) -> dict[str, Any]:
        answer = self._call("stats")
        return answer if isinstance(answer, dict) else {}

    def metrics(self) -> str:
        return str(self._call("metrics"))

    def live(self) -> LiveLoad | None:
        """The hot path's live latency (None: it can't be reached or said nothing)."""
        try:
            answer = self._call("live")
        except ControlError:
            return None
        if not isinstance(answer, dict):
            return None
        try:
            return LiveLoad(**answer)
        except TypeError:
            return None

    def alarms(self, most: int = 64) -> list[dict[str, str]]:
        answer = self._call("alarms", max=most)
        items = answer.get("alarms", []) if isinstance(answer, dict) else []
        return [
            {"alarm": str(a.get("alarm", "")), "message": str(a.get("message", ""))}
            for a in items
            if isinstance(a, dict)
        ]
