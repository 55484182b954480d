"""What the agent tells systemd (``Type=notify``): ``READY=1`` once the hot path answers
with its pipelines started, ``WATCHDOG=1`` only while the hot path answers and none of
its pipelines' loops is wedged, ``STATUS=`` lines that say what it does, ``STOPPING=1``.

The hot path is asked on a thread of its own (:class:`HotPathWatch`: its ``health``,
whose ``pipelines`` carry each pipeline loop's heartbeat); the owner's main loop calls
:meth:`HotPathWatch.tick`, which notifies. So the watchdog is petted only while both the
main loop (the supervisor's, which restarts the children) and the hot path's pipelines
go round. A camera that delivers no frame is not a wedge: a pipeline's loop beats while
it waits for one. A hot path that does not answer (stopped, stuck, dead) is.

:func:`judge` is the pure rule, tested without processes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.kernel.sdnotify import Notifier

log = logging.getLogger(__name__)

PROBE_MIN_S = 0.1
PROBE_MAX_S = 5.0
"""The hot path is asked every quarter of the watchdog's interval, within these bounds."""
PROBE_TIMEOUT_MIN_S = 0.5
FIRST_PROBE_S = 0.25
"""How often the hot path is asked until it first answers."""
STATUS_PROBE_S = 5.0
"""How often the hot path is asked when the watchdog is off (for ``STATUS=`` only)."""

Probe = Callable[[float], Any]
"""Asks the hot path's ``health`` with a timeout; returns its answer ``[ok, details]``
or raises (no answer)."""


@dataclass(frozen=True)
class Verdict:
    """One answer (or its absence), judged.

    Attributes:
        answered: the hot path answered.
        alive: the watchdog may be petted on this answer.
        status: one line for ``STATUS=``.
    """

    answered: bool
    alive: bool
    status: str


def judge(answer: Any) -> Verdict:
    """Judge the hot path's ``health`` answer (``[ok, details]``; None: no answer).

    Alive: it answered and no pipeline's loop is wedged. A pool that is not started (a
    bundle missing) is no wedge: a restart would not cure it, and the companion must stay
    up to receive the bundle.
    """
    if answer is None:
        return Verdict(answered=False, alive=False, status="the hot path does not answer")
    try:
        ok, details = bool(answer[0]), dict(answer[1])
        loops = {str(k): dict(v) for k, v in dict(details.get("pipelines", {})).items()}
    except (TypeError, ValueError, IndexError, KeyError):
        return Verdict(answered=True, alive=False, status="the hot path's answer is malformed")
    wedged = sorted(name for name, loop in loops.items() if loop.get("wedged"))
    if wedged:
        ages = ", ".join(f"{n} (no loop for {loops[n].get('loop_age_s', '?')} s)" for n in wedged)
        return Verdict(answered=True, alive=False, status=f"pipeline wedged: {ages}")
    problems = list(details.get("problems", []))
    names = ", ".join(sorted(loops)) or "none"
    text = f"deciding: {len(loops)} pipeline{'s' if len(loops) != 1 else ''} ({names})"
    if not ok:
        text += f"; not healthy: pool {details.get('pool', '?')}"
    if problems:
        text += f"; {len(problems)} not started: {problems[0]}"
    return Verdict(answered=True, alive=True, status=text)


class HotPathWatch:
    """Asks the hot path on a thread; :meth:`tick` (from the owner's loop) notifies.

    Args:
        notifier: where notifications go (nothing is started when it is disabled).
        probe: asks the hot path's ``health`` (see :data:`Probe`).
        grace: true while the owner is bringing a new hot path up (a restart): the
            watchdog is petted meanwhile, since the owner itself is doing its job.
    """

    def __init__(
        self,
        notifier: Notifier,
        probe: Probe,
        *,
        grace: Callable[[], bool] = lambda: False,
    ) -> None:
        self.notifier = notifier
        self._probe = probe
        self._grace = grace
        pet = notifier.pet_interval_s
        self.pet_s = pet
        quarter = pet / 2 if pet is not None else STATUS_PROBE_S
        self.probe_s = min(PROBE_MAX_S, max(PROBE_MIN_S, quarter))
        self.timeout_s = max(PROBE_TIMEOUT_MIN_S, self.probe_s)
        self.tick_s = min(0.5, self.probe_s)
        """How often the owner's loop should call :meth:`tick` at least."""
        self.ready_sent = False
        self.pets = 0
        self.unanswered = 0
        """Questions the hot path did not answer."""
        self.last_alive_at = float("-inf")
        """When (monotonic) the last answer that keeps the watchdog petted was asked for."""
        self._verdict: Verdict | None = None
        self._status_sent = ""
        self._next_pet = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> HotPathWatch:
        """Start asking (only when there is a systemd to tell)."""
        if self.notifier.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="sd-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self, status: str = "stopping") -> None:
        """``STOPPING=1`` and stop asking."""
        self._stop.set()
        self.notifier.stopping(status)
        if self._thread is not None:
            self._thread.join(self.timeout_s + 1.0)

    def _loop(self) -> None:
        while not self._stop.is_set():
            asked = time.monotonic()
            try:
                answer = self._probe(self.timeout_s)
            except Exception as exc:  # noqa: BLE001 - any failure is "no answer": counted
                self.unanswered += 1
                log.debug("hot path health: %s", exc)
                answer = None
            verdict = judge(answer)
            with self._lock:
                self._verdict = verdict
                if verdict.alive:
                    self.last_alive_at = asked
            # until the first answer, ask often: READY=1 should not wait a whole period
            period = self.probe_s if verdict.answered or self.ready_sent else FIRST_PROBE_S
            self._stop.wait(max(0.0, min(self.probe_s, period) - (time.monotonic() - asked)))

    def tick(self, now: float | None = None) -> None:
        """Send what is due: ``READY=1`` at the first answer, ``STATUS=`` when it
        changed, ``WATCHDOG=1`` every half interval while the hot path was alive within
        the last half interval (or during the owner's grace)."""
        if not self.notifier.enabled:
            return
        now = time.monotonic() if now is None else now
        with self._lock:
            verdict, alive_at = self._verdict, self.last_alive_at
        if verdict is not None and verdict.answered and not self.ready_sent:
            self.ready_sent = self.notifier.ready(verdict.status)
            self._status_sent = verdict.status
        elif verdict is not None and self.ready_sent and verdict.status != self._status_sent:
            self.notifier.status(verdict.status)
            self._status_sent = verdict.status
        if self.pet_s is None or now < self._next_pet:
            return
        if now - alive_at <= self.pet_s or self._grace():
            if self.notifier.watchdog():
                self.pets += 1
            self._next_pet = now + self.pet_s
