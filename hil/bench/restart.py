"""How long the line is dark after a crash: ``edge-agent run`` (the supervisor, the hot
path and the companion as processes of their own, :mod:`agent.supervisor`) on a looped
video with a real bundle; the hot path SIGKILLed N times, each time the seconds from the
kill to the next decision in the log (the decision's own time, and when the log had it);
the companion SIGKILLed M times, each time the seconds until ``/healthz`` answers again.

Each kill waits until the process has lived :data:`agent.supervisor.CRASH_LOOP_S`, so
the figures are the restart's and not the crash-loop backoff's. The companion is
restarted after a backoff of 1 s (by design: a companion that dies at once is not
restarted in a tight loop); its figure includes it.

``hil bench restart --json PATH`` (or ``python -m hil.bench.restart``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

from agent.control.client import ControlClient
from agent.control.protocol import ControlError
from agent.supervisor import CRASH_LOOP_S
from hil.errors import HilError
from hil.loopback import free_port
from hil.procs import agent_children

BIN = Path(sys.executable).parent
"""Where this interpreter's console scripts (``edge-agent``) are."""
START_S = 120.0
"""The longest wait for the agent's first decision and ``/healthz``."""
RESTART_S = 60.0
"""The longest wait for one restart."""
SETTLE_S = CRASH_LOOP_S + 0.5
"""How long a process lives before it is killed (past the crash-loop window)."""
STOP_S = 30.0
POLL_S = 0.02
TARGET_S = 2.0
"""Issue 15: a crash of the hot path is restarted within 2 s (to its next decision)."""
DEVICE_ID = "restart-bench"


class RestartBenchError(HilError):
    """The restart bench can't set up or run.

    Attributes:
        reason: what failed.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"restart bench: {reason}")


class BenchAgent:
    """``edge-agent run`` in ``directory`` on ``bundle`` and a file camera looping
    ``video`` at ``fps``; its decision log, its children and its ``/healthz``."""

    def __init__(
        self, directory: Path, bundle: Path, video: Path, fps: float, workers: int | None
    ) -> None:
        self.dir = directory
        self.state = directory / "state"
        self.config = directory / "agent.toml"
        self.log_file = directory / "agent.log"
        self.http_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        runtime = f"[runtime]\nworkers = {workers}\n" if workers else ""
        self.config.write_text(
            f'[agent]\ndevice_id = "{DEVICE_ID}"\nstate_dir = "{self.state}"\n'
            f'log_level = "warning"\n{runtime}'
            f'[http]\nport = {self.http_port}\n[decision_log]\nthumbnails = "none"\n'
            f'[[cameras]]\nname = "cam"\nkind = "file"\nuri = "{video.resolve()}"\n'
            f"fps = {fps}\nloop = true\n"
            f'[[pipelines]]\nname = "line"\nsource = "cam"\nbundle = "{bundle.resolve()}"\n'
        )

    @property
    def log_path(self) -> Path:
        return self.state / "decisions.db"

    def start(self) -> None:
        with self.log_file.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(BIN / "edge-agent"), "run", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> int | None:
        """SIGTERM the supervisor; its exit code (None: it had to be killed)."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(STOP_S)
            return None

    def check_alive(self) -> None:
        """Raises: RestartBenchError: the supervisor exited (with its log's tail)."""
        if self.proc is None or self.proc.poll() is not None:
            tail = (
                self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            )
            code = None if self.proc is None else self.proc.returncode
            raise RestartBenchError(f"edge-agent run exited ({code}):\n{tail}")

    def child(self, role: str) -> int | None:
        """The pid of the supervisor's ``python -m agent.child ROLE``, if running."""
        assert self.proc is not None
        return agent_children(self.proc.pid).get(role)

    def first_decision_after(self, t: float) -> float | None:
        """The time of the first decision in the log made after wall-clock ``t``."""
        if not self.log_path.is_file():
            return None
        conn = sqlite3.connect(self.log_path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            row = conn.execute(
                "SELECT min(decision_time) FROM decisions WHERE decision_time > ?", (t,)
            ).fetchone()
        except sqlite3.OperationalError:  # the table is not made yet
            return None
        finally:
            conn.close()
        return None if row is None or row[0] is None else float(row[0])

    def integrity(self) -> str:
        conn = sqlite3.connect(self.log_path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
        finally:
            conn.close()

    def healthz(self) -> dict[str, Any] | None:
        """``/healthz``'s body (200 or 503), None while nothing answers."""
        url = f"http://127.0.0.1:{self.http_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                body: dict[str, Any] = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read())
        except OSError:
            return None
        return body

    def hello(self) -> dict[str, Any]:
        """The hot path's ``hello`` (through the socket the supervisor gave it)."""
        pid = self.child("hotpath")
        if pid is None:
            raise RestartBenchError("no hot path to ask")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        found = [e.split(b"=", 1)[1] for e in environ if e.startswith(b"EDGEFLEET_CONTROL_SOCKET=")]
        if not found:
            raise RestartBenchError("the hot path has no control socket in its environment")
        client = ControlClient(Path(found[0].decode()), timeout_s=10.0)
        try:
            answer: dict[str, Any] = client.call("hello")
        except ControlError as exc:
            raise RestartBenchError(f"the hot path does not answer: {exc.reason}") from exc
        finally:
            client.close()
        return answer


def _until(what: str, timeout_s: float, agent: BenchAgent, probe: Any) -> Any:
    """``probe()``'s first value that is not None, polled every :data:`POLL_S`.

    Raises:
        RestartBenchError: none within ``timeout_s``, or the agent exited.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        agent.check_alive()
        value = probe()
        if value is not None:
            return value
        time.sleep(POLL_S)
    raise RestartBenchError(f"no {what} within {timeout_s:g} s")


def _new_pid(agent: BenchAgent, role: str, old: int) -> Any:
    def probe() -> int | None:
        pid = agent.child(role)
        return pid if pid not in (None, old) else None

    return _until(f"new {role}", RESTART_S, agent, probe)


def process_age_s(pid: int) -> float:
    """Seconds since ``pid`` started (``/proc``: its start in clock ticks since boot).

    Raises:
        RestartBenchError: the process is gone.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except OSError as exc:
        raise RestartBenchError(f"process {pid} is gone") from exc
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime
    return uptime - ticks / os.sysconf("SC_CLK_TCK")


def _settle(agent: BenchAgent, role: str) -> int:
    """Wait until the ``role`` child has lived :data:`SETTLE_S`; its pid.

    Raises:
        RestartBenchError: there is no such child.
    """
    pid = _until(role, RESTART_S, agent, lambda: agent.child(role))
    time.sleep(max(0.0, SETTLE_S - process_age_s(pid)))
    return int(pid)


def _summary(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median_s": None, "max_s": None}
    return {"median_s": round(statistics.median(values), 3), "max_s": round(max(values), 3)}


def bench_restart(
    bundle: Path,
    video: Path,
    *,
    kills: int,
    companion_kills: int,
    fps: float,
    workers: int | None,
    directory: Path | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Run the bench; the figures (see :func:`format_report`).

    Raises:
        RestartBenchError: the bundle or video is missing, or the agent failed.
    """
    say = progress or (lambda _m: None)
    if not (bundle / "manifest.json").is_file():
        raise RestartBenchError(
            f"no bundle at {bundle} (make one: python -m hil.demo_assets --dir .cache/demo "
            "--models .cache/models)"
        )
    if not video.is_file():
        raise RestartBenchError(f"no video at {video}")
    work = Path(tempfile.mkdtemp(prefix="bench-restart-")) if directory is None else directory
    work.mkdir(parents=True, exist_ok=True)
    agent = BenchAgent(work, bundle, video, fps, workers)
    hot_decision: list[float] = []
    hot_logged: list[float] = []
    hot_spawn: list[float] = []
    hot_takeovers = 0
    hot_imports: list[float] = []
    hot_start_to_decision: list[float] = []
    comp_healthz: list[float] = []
    comp_spawn: list[float] = []
    try:
        started = time.monotonic()
        t_start = time.time()
        agent.start()
        _until("first decision", START_S, agent, lambda: agent.first_decision_after(t_start))
        _until("/healthz", START_S, agent, agent.healthz)
        say(f"agent up in {time.monotonic() - started:.1f} s (log: {agent.log_file})")
        for i in range(max(kills, companion_kills)):
            if i < kills:
                old = _settle(agent, "hotpath")
                os.kill(old, signal.SIGKILL)
                t_kill, m_kill = time.time(), time.monotonic()
                new = _new_pid(agent, "hotpath", old)
                respawn = time.monotonic() - m_kill - process_age_s(new)
                if respawn < 0:  # a standby, started before the kill, took over
                    hot_takeovers += 1
                hot_spawn.append(respawn)
                first = _until(
                    "decision after the kill", RESTART_S, agent,
                    lambda t=t_kill: agent.first_decision_after(t),
                )  # fmt: skip
                hot_logged.append(time.time() - t_kill)
                hot_decision.append(first - t_kill)
                hello = agent.hello()
                if respawn >= 0:  # a standby's age includes its wait
                    hot_imports.append(process_age_s(new) - float(hello["up_s"]))
                if hello.get("first_decision_s") is not None:
                    hot_start_to_decision.append(float(hello["first_decision_s"]))
                say(f"hot path kill {i + 1}/{kills}: next decision after {first - t_kill:.3f} s")
            if i < companion_kills:
                old = _settle(agent, "companion")
                os.kill(old, signal.SIGKILL)
                m_kill = time.monotonic()
                _until("end of the killed companion's /healthz", RESTART_S, agent,
                       lambda: None if agent.healthz() is not None else True)  # fmt: skip
                new = _new_pid(agent, "companion", old)
                comp_spawn.append(time.monotonic() - m_kill - process_age_s(new))
                _until("/healthz after the kill", RESTART_S, agent, agent.healthz)
                comp_healthz.append(time.monotonic() - m_kill)
                say(f"companion kill {i + 1}/{companion_kills}: /healthz again after "
                    f"{comp_healthz[-1]:.3f} s")  # fmt: skip
        agent.check_alive()
        integrity = agent.integrity()
    finally:
        exit_code = agent.stop()
        if directory is None:
            shutil.rmtree(work, ignore_errors=True)
    hot = _summary(hot_decision)
    return {
        "kills": kills,
        "hotpath_to_decision_s": [round(v, 3) for v in hot_decision],
        "hotpath_to_decision_median_s": hot["median_s"],
        "hotpath_to_decision_max_s": hot["max_s"],
        "hotpath_to_logged_s": [round(v, 3) for v in hot_logged],
        "hotpath_respawn_s": [round(v, 3) for v in hot_spawn],
        "hotpath_standby_takeovers": hot_takeovers,
        "hotpath_exec_to_start_s": [round(v, 3) for v in hot_imports],
        "hotpath_start_to_decision_s": [round(v, 3) for v in hot_start_to_decision],
        "companion_kills": companion_kills,
        "companion_to_healthz_s": [round(v, 3) for v in comp_healthz],
        "companion_to_healthz_median_s": _summary(comp_healthz)["median_s"],
        "companion_to_healthz_max_s": _summary(comp_healthz)["max_s"],
        "companion_respawn_s": [round(v, 3) for v in comp_spawn],
        "target_s": TARGET_S,
        "target_met": hot["max_s"] is not None and hot["max_s"] <= TARGET_S,
        "log_integrity": integrity,
        "agent_exit": exit_code,
        "settings": {
            "bundle": str(bundle),
            "video": str(video),
            "fps": fps,
            "workers": workers,
            "settle_s": SETTLE_S,
        },
        "machine": machine(),
    }


def machine() -> dict[str, Any]:
    """Cores, CPU model and Python version."""
    model = platform.processor()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        model = next(
            (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model
        )
    return {"cores": os.cpu_count(), "cpu": model, "python": platform.python_version()}


def format_report(r: dict[str, Any]) -> str:
    """The figures as a few readable lines."""
    m = r["machine"]
    verdict = "met" if r["target_met"] else "NOT met"
    return "\n".join(
        [
            f"machine: {m['cores']} cores, {m['cpu']}",
            f"hot path SIGKILLed x{r['kills']}: next decision after median "
            f"{r['hotpath_to_decision_median_s']} s, max {r['hotpath_to_decision_max_s']} s "
            f"(a waiting standby took over {r['hotpath_standby_takeovers']} times; new "
            f"processes: {r['hotpath_exec_to_start_s']} s of interpreter, imports and config; "
            f"start to first decision {r['hotpath_start_to_decision_s']} s)",
            f"companion SIGKILLed x{r['companion_kills']}: /healthz again after median "
            f"{r['companion_to_healthz_median_s']} s, max {r['companion_to_healthz_max_s']} s "
            "(restart backoff 1 s included)",
            f"decision log: integrity {r['log_integrity']}; edge-agent exit {r['agent_exit']}",
            f"target: next decision within {r['target_s']:g} s of a hot path crash: {verdict}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hil bench restart",
        description="Crash recovery of edge-agent run: the hot path and the companion "
        "SIGKILLed in turn; the time to the next decision and to /healthz answering again.",
        epilog="example: hil bench restart --bundle .cache/demo/bundles/text-cls "
        "--source .cache/demo/line.avi --kills 5 --json .cache/bench-restart.json",
    )
    parser.add_argument("--bundle", type=Path, default=Path(".cache/demo/bundles/text-cls"),
                        help="model bundle the agent runs (default: %(default)s)")  # fmt: skip
    parser.add_argument("--source", type=Path, default=Path(".cache/demo/line.avi"),
                        help="video the agent's camera loops (default: %(default)s)")  # fmt: skip
    parser.add_argument("--kills", type=int, default=5, help="hot path kills (default: 5)")
    parser.add_argument("--companion-kills", type=int, default=None,
                        help="companion kills (default: as many as --kills)")  # fmt: skip
    parser.add_argument("--fps", type=float, default=15.0, help="camera fps (default: 15)")
    parser.add_argument("--workers", type=int, default=None, help="runtime workers")
    parser.add_argument("--dir", type=Path, default=None,
                        help="keep the agent's files here (default: a temp directory)")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    if args.kills < 0 or (args.companion_kills or 0) < 0 or args.fps <= 0:
        parser.error("--kills and --companion-kills must be >= 0, --fps > 0")
    signal.signal(signal.SIGTERM, _terminated)  # stop the agent in order

    def say(message: str) -> None:
        if not args.quiet:
            print(f"bench-restart: {message}", file=sys.stderr, flush=True)

    companion_kills = args.kills if args.companion_kills is None else args.companion_kills
    try:
        result = bench_restart(
            args.bundle, args.source, kills=args.kills, companion_kills=companion_kills,
            fps=args.fps, workers=args.workers, directory=args.dir, progress=say,
        )  # fmt: skip
    except HilError as exc:
        print(f"bench-restart: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench-restart: interrupted", file=sys.stderr)
        return 130
    print(format_report(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _terminated(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
