"""``make demo``: the fleet server with its Mosquitto, two agents on looped videos, and a
signed model rolled out to them in waves, every step printed.

1. a conveyor video and two bundles from real pretrained models (:mod:`hil.demo_assets`):
   PP-OCRv4 text detection, then the PP-OCR direction classifier on each text box;
2. the fleet: an encrypted keystore (a passphrase made for this run only), a TUF
   repository with text-det 4.0.1 (release 2) signed in it, and ``fleet-server serve``
   with its managed Mosquitto (TLS, a certificate per device);
3. two agents (cam-a, cam-b) enrolled with one-time tokens (``fleetctl devices enroll``,
   ``edge-agent enroll``), each deciding on its own looped video; rejects go to a local
   Mosquitto for the robot;
4. ``fleetctl rollouts create --bundle text-det@4.0.1 --waves 1,100% --shadow 90s
   --approval``: each wave first runs the candidate in the device's shadow slot beside
   the live model on a sampled share of the frames (never acting), and switches only when
   the pooled agreement's Wilson lower bound reaches ``--min-agreement``; then the fleet
   signs the switch for cam-a, which verifies, installs, health-checks and commits it;
   the next wave waits for an operator's approval, which raises an alert: the fleet
   server POSTs it, signed, to a webhook receiver the demo runs on loopback (which checks
   the signature), the demo approves (``fleetctl rollouts approve``), cam-b switches and
   the alert resolves, POSTed again; the agreement, ``fleetctl rollouts status``,
   ``fleetctl alerts`` and ``fleetctl devices list`` are printed;
5. a decision of cam-a as the fleet's review API has it, with the thumbnail the agent
   uploaded (what the console's decision page shows);
6. the decisions each agent logged, before and after its switch;
7. cam-a is an inspection station: a simulated PLC (an OPC UA server, :mod:`hil.plc`)
   steps its trigger counter for each label card with the card's part id, cam-a takes
   the card's picture (its camera's software trigger), decides, and writes the outcome
   code, the reject bit and the decision id back before the station's deadline; the
   demo prints the PLC's view (part id -> outcome, trigger-to-result ms as the PLC saw
   it) beside cam-a's decision log filtered by station.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agent.line.results import STATUS_CODES
from hil.demo_assets import edit_manifest, prepare
from hil.loopback import free_port, start_broker
from hil.plc.opcua_plc import LINE_VARIABLES, OpcUaPlc, Variable
from hil.webhooks import WebhookReceiver
from runtime.profiles import load_profile

ROOT = Path(__file__).resolve().parent.parent

BIN = Path(sys.executable).parent
AGENTS = ("cam-a", "cam-b")
STATION_AGENT = "cam-a"
TRIGGER_PERIOD_S = 0.4
"""The PLC triggers a card this often (a line at 2.5 parts a second)."""
STATION_DEADLINE_MS = 1500
"""The station's deadline: the two models on this machine's shared cores take about
0.2-0.6 s a card while the fleet, a second agent and the rollout run beside them."""
STATION = """
# cam-a is an inspection station: its camera takes one card picture per PLC trigger
[[cameras]]
name = "cam1"
kind = "images"
uri = "{cards}"
trigger_mode = "software"
line = "1"

[[plc]]
name = "plc1"
driver = "opcua"
endpoint = "{endpoint}"
security = "none"                        # loopback demo; a line uses sign_and_encrypt

[[stations]]
name = "label-gate"
pipeline = "label-orientation"
plc = "plc1"
capture = "software_trigger"
deadline_ms = {deadline}
fail_safe = "reject"
trigger = {{ point = "{ns};s=TriggerCount", type = "uint32", edge = "change", poll_ms = 5 }}
part_id = {{ point = "{ns};s=PartId", type = "string" }}
outputs = [
  {{ point = "{ns};s=OutcomeCode", type = "int16", value = "outcome_code" }},
  {{ point = "{ns};s=Reject", type = "bool", value = "outcome_is", outcome = "reject" }},
  {{ point = "{ns};s=DecisionId", type = "string", value = "decision_id" }},
  {{ point = "{ns};s=Status", type = "uint16", value = "status" }},
  {{ point = "{ns};s=Seq", type = "uint32", value = "seq" }},  # last: written after the rest
]
"""
CAMERA = """
[[cameras]]
name = "cam1"
kind = "file"
uri = "{video}"
fps = 10
loop = true
line = "1"  # the line it is enrolled on (--labels line=1): drift is kept for that line only
"""
SHADOW_MIN = 40
"""Shadow frames a wave needs before its agreement is judged (10 fps, half sampled)."""
WEBHOOK_SECRET_ENV = "EDGEFLEET_DEMO_WEBHOOK"  # noqa: S105 - the name of a secret
ALERTS = """[alerts]
interval_s = 1.0
[alerts.delivery]
poll_s = 0.5
[[alerts.webhooks]]
name = "demo"
url = "{url}"
secret_env = "{secret_env}"
rules = ["rollout_awaiting_approval", "rollout_gate_stopped", "rollout_rolled_back"]
"""
ALERT_WAIT_S = 30.0

AGENT_CONFIG = """[agent]
device_id = "{device}"
state_dir = "state"
log_level = "warning"

[runtime]
workers = 1

[mqtt]
port = {local_port}

[http]
port = 0

{camera}
[[pipelines]]
name = "label-orientation"
source = "cam1"
installed = "text-det"
bundle = "{bundles}/text-det"
chain = [{{ bundle = "{bundles}/text-cls", max_crops = 4, padding = 0.1 }}]

[pipelines.policy]
default = "pass"
rules = [
  {{ outcome = "review", min_count = 0, max_count = 0 }},
  {{ outcome = "reject", label = "180", min_score = 0.8 }},
  {{ outcome = "review", max_score = 0.8 }},
]

[uplink]
enabled = true

[bundles]
enabled = true
installer = {{ health_window_s = 3.0, benchmark_runs = 5 }}

[shadow]
sample = 0.5                             # half the frames also go to a shadow candidate

[[actions.actions]]
name = "robot"
kind = "mqtt"
topic = "factory/{{line}}/{{source}}/{{outcome}}"
outcomes = ["reject"]
"""


def show_webhook(hook: WebhookReceiver, event: str, rule: str, rollout_id: str) -> None:
    """Print the receiver's ``event`` of the rollout's ``rule`` alert once it came (checked
    there: the HMAC-SHA256 signature over the timestamp and the body, its age, once per id)."""

    def came() -> list[Any]:
        return [
            r
            for r in hook.received
            if r.event == event and r.alert.get("rule") == rule and r.alert.get("key") == rollout_id
        ]

    try:
        hook.wait_for(f"the alert's {event}", lambda: bool(came()), ALERT_WAIT_S)
    except AssertionError as exc:
        print(f"   the webhook receiver: no {event} yet ({exc})", flush=True)
        return
    got = came()[0]
    a = got.alert
    print(
        f"== webhook {hook.url}: alert.{event} {a['rule']} {a['key']} ({a['severity']}): "
        f"{a['summary']}; signature verified, delivery {got.delivery_id[:12]}",
        flush=True,
    )


def show_remote(env: dict[str, str], d: Path, device: str) -> None:
    """The operator's remote tools on one device: its log lines about the installs, and a
    diagnostics archive saved here (docs/device-logs-and-actions.md)."""
    out = d / f"diagnostics-{device}.tar.gz"
    for args in (
        ("devices", "logs", device, "--since", "15m", "--grep", "install", "--lines", "6"),
        ("devices", "diagnostics", device, "--out", str(out)),
    ):
        print(f"\n$ fleetctl {' '.join(args)}", flush=True)
        try:
            print(fleetctl(env, *args, "--wait", "30").rstrip(), flush=True)
        except subprocess.CalledProcessError as exc:
            print(f"   {str(exc.stderr).strip()}", flush=True)


def run(args: list[str], env: dict[str, str], **kw: object) -> str:
    out = subprocess.run(args, env=env, check=True, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    return str(out.stdout)


def fleetctl(env: dict[str, str], *args: str) -> str:
    return run([str(BIN / "fleetctl"), *args], env)


def api_get(env: dict[str, str], path: str) -> tuple[bytes, str]:
    """GET ``path`` of the fleet API with the operator token: (body, content type)."""
    req = urllib.request.Request(  # the demo's own server on loopback
        env["EDGEFLEET_SERVER"] + path,
        headers={"Authorization": f"Bearer {env['EDGEFLEET_API_TOKEN']}"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read(), resp.headers.get("Content-Type", "")


def show_review(env: dict[str, str], device: str) -> None:
    """What a line manager sees: the device's uploaded decisions, one with its image."""
    for outcome in ("reject", "review"):
        body, _ = api_get(env, f"/api/v1/decisions?device={device}&outcome={outcome}&limit=20")
        for row in json.loads(body)["rows"]:
            try:
                jpeg, kind = api_get(env, f"/api/v1/decisions/{row['id']}/image")
            except urllib.error.HTTPError:
                continue  # its thumbnail is not there yet
            print(
                f"== the fleet's review of {device}: {row['id']} {row['outcome']}, "
                f"its thumbnail {len(jpeg)} bytes {kind} "
                f"at /api/v1/decisions/{row['id']}/image; the console shows it at "
                f"/ui/decisions/{row['id']}",
                flush=True,
            )
            return
    print(f"== the fleet's review of {device}: no decision with a thumbnail yet", flush=True)


class LinePlc:
    """The simulated PLC of cam-a's station: every :data:`TRIGGER_PERIOD_S` it writes the
    next card's part id and steps the trigger counter, then watches for the station's
    result (its sequence number changing) and keeps what it saw."""

    def __init__(self, plc: OpcUaPlc) -> None:
        self.plc = plc
        self.seen: list[tuple[str, int, bool, str, float, int]] = []
        """(part id, outcome code, reject bit, decision id, trigger-to-result ms, status)."""
        self.unanswered = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-plc", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started: a demo that failed before may not have
            self._thread.join(10)

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(TRIGGER_PERIOD_S):
            n += 1
            try:
                self._part(n)
            except Exception as exc:  # noqa: BLE001 - a demo PLC that stopped would stop the cards
                self.errors += 1
                if self.errors <= 3:
                    print(f"   the PLC: card {n}: {type(exc).__name__}: {exc}", flush=True)

    def _part(self, n: int) -> None:
        part = f"CARD-{n:05d}"
        before = self.plc.get("Seq")
        self.plc.set("PartId", part)
        t0 = time.perf_counter()
        self.plc.set("TriggerCount", n)
        while time.perf_counter() - t0 < STATION_DEADLINE_MS / 1000 * 2:
            if self.plc.get("Seq") != before:
                ms = (time.perf_counter() - t0) * 1000
                self.seen.append(
                    (
                        part,
                        int(self.plc.get("OutcomeCode")),
                        bool(self.plc.get("Reject")),
                        str(self.plc.get("DecisionId")),
                        ms,
                        int(self.plc.get("Status")),
                    )
                )
                break
            time.sleep(0.002)
        else:
            self.unanswered += 1

    def report(self) -> None:
        names = {1: "pass", 2: "reject", 3: "review"}
        statuses = {v: k for k, v in STATUS_CODES.items()}
        print(f"== the PLC's view of station label-gate ({len(self.seen)} cards):", flush=True)
        print("   part id     outcome reject status          trigger->result  decision id")
        for part, code, reject, decision, ms, status in self.seen[-8:]:
            outcome = names.get(code, str(code))
            word = statuses.get(status, str(status))
            print(
                f"   {part}  {outcome:<7} {reject!s:<6} {word:<15} {ms:9.1f} ms     "
                f"{decision or '-'}"
            )
        counts: dict[str, int] = {}
        for x in self.seen:
            word = statuses.get(x[5], str(x[5]))
            counts[word] = counts.get(word, 0) + 1
        print(f"   by status: {counts}", flush=True)
        if self.seen:
            times = sorted(x[4] for x in self.seen)
            print(
                f"   trigger->result as the PLC saw it: p50 {times[len(times) // 2]:.1f} ms, "
                f"max {times[-1]:.1f} ms; not answered: {self.unanswered}",
                flush=True,
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=str(ROOT / ".cache/models"))
    ap.add_argument("--dir", default=str(ROOT / ".cache/demo"))
    args = ap.parse_args()
    logging.getLogger("asyncua").setLevel(logging.ERROR)  # the PLC's "no security" notes
    d = Path(args.dir).resolve()
    prepare(d, Path(args.models))
    fleet = d / "fleet"
    shutil.rmtree(fleet, ignore_errors=True)
    shutil.rmtree(d / "agents", ignore_errors=True)
    api, mqtt = free_port(), free_port()
    env = os.environ | {
        "EDGEFLEET_KEY_PASSPHRASE": secrets.token_urlsafe(24),
        "EDGEFLEET_API_TOKEN": secrets.token_urlsafe(24),
        "EDGEFLEET_SERVER": f"http://127.0.0.1:{api}",
        WEBHOOK_SECRET_ENV: secrets.token_urlsafe(24),
    }
    hook = WebhookReceiver(env[WEBHOOK_SECRET_ENV].encode()).start()
    keys, repo = fleet / "keys", fleet / "repo"
    print("== fleet: keys, repository, text-det 4.0.1 (release 2) signed", flush=True)
    fleetctl(env, "keys", "init", "--keystore", str(keys))
    fleetctl(env, "repo", "init", "--repo", str(repo), "--keystore", str(keys))
    r2 = fleet / "text-det-r2"
    shutil.copytree(d / "bundles" / "text-det", r2)
    edit_manifest(r2 / "manifest.json", version="4.0.1", release=2, latency_budget_ms=1000.0)
    fleetctl(env, "bundle", "publish", str(r2), "--repo", str(repo), "--keystore", str(keys))
    (fleet / "fleet.toml").write_text(
        f'[server]\nstate_dir = "state"\n[http]\nport = {api}\n'
        'operator_token_env = "EDGEFLEET_API_TOKEN"\n'
        f"[broker.mosquitto]\nport = {mqtt}\npersistence = false\n"
        f'[repository]\npath = "{repo}"\nkeystore = "{keys}"\n[rollouts]\ntick_s = 1.0\n'
        + ALERTS.format(url=hook.url, secret_env=WEBHOOK_SECRET_ENV)
    )
    local = start_broker(d)
    local_port = local.port
    plc = OpcUaPlc(
        d / "plc",
        variables=(
            *LINE_VARIABLES,
            Variable("Reject", "bool", False),
            Variable("Status", "uint16", 0),
        ),
    )
    plc.start()
    line_plc = LinePlc(plc)
    procs: list[subprocess.Popen[bytes]] = []
    server = subprocess.Popen(
        [str(BIN / "fleet-server"), "serve", "--config", str(fleet / "fleet.toml")],
        env=env,
        stdout=(fleet / "fleet.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(200):
            try:
                fleetctl(env, "devices", "list", "--json")
                break
            except subprocess.CalledProcessError:
                time.sleep(0.2)
        print(f"== fleet-server serve: API on :{api}, Mosquitto (TLS) on :{mqtt}", flush=True)
        profile = load_profile("auto").name
        for dev in AGENTS:
            token = json.loads(
                fleetctl(
                    env,
                    "devices",
                    "enroll",
                    dev,
                    "--labels",
                    "line=1",
                    "--profile",
                    profile,
                    "--json",
                )
            )["token"]
            home = d / "agents" / dev
            home.mkdir(parents=True)
            cfg = home / "agent.toml"
            camera = (
                STATION.format(
                    cards=d / "cards",
                    endpoint=plc.endpoint,
                    ns=plc.node_id("x").split(";")[0],
                    deadline=STATION_DEADLINE_MS,
                )
                if dev == STATION_AGENT
                else CAMERA.format(video=d / "line.avi")
            )
            cfg.write_text(
                AGENT_CONFIG.format(
                    device=dev, local_port=local_port, camera=camera, bundles=d / "bundles"
                )
            )
            run(
                [
                    str(BIN / "edge-agent"),
                    "enroll",
                    env["EDGEFLEET_SERVER"],
                    "--token",
                    "-",
                    "--config",
                    str(cfg),
                ],
                env,
                input=token,
            )
            print(
                f"== {dev}: enrolled (key made on the device, certificate from the fleet CA)",
                flush=True,
            )
            procs.append(
                subprocess.Popen(
                    [str(BIN / "edge-agent"), "run", "--config", str(cfg), "--echo"],
                    env=env,
                    stdout=(home / "echo.log").open("wb"),
                    stderr=subprocess.STDOUT,
                )
            )
        for _ in range(150):
            devices = json.loads(fleetctl(env, "devices", "list", "--json"))
            if sum(1 for x in devices if x.get("online")) == len(AGENTS):
                break
            time.sleep(0.2)
        print(fleetctl(env, "devices", "list"), flush=True)
        line_plc.start()
        print(
            f"== the PLC ({plc.endpoint}) triggers cam-a's station every "
            f"{TRIGGER_PERIOD_S:g} s with a card's part id",
            flush=True,
        )
        time.sleep(3)
        policy = fleet / "policy.json"
        # Two agents share this machine's cores with the fleet server, so the p99 of one
        # release against the other is noise here: gate on install failures and rollbacks.
        policy.write_text(json.dumps({"gates": {"max_p99_ratio": None}}))
        created = json.loads(
            fleetctl(
                env,
                "rollouts",
                "create",
                "--bundle",
                "text-det@4.0.1",
                "--select",
                "line=1",
                "--waves",
                "1,100%",
                "--soak",
                "3s",
                "--shadow",
                "90s",
                "--shadow-min",
                str(SHADOW_MIN),
                "--min-agreement",
                "0.9",
                "--policy",
                str(policy),
                "--approval",
                "--json",
            )
        )
        rid = created["rollout_id"]
        print(
            f"== fleetctl rollouts create --bundle text-det@4.0.1 --select line=1 "
            f"--waves 1,100% --soak 3s --shadow 90s --shadow-min {SHADOW_MIN} "
            f"--min-agreement 0.9 --approval  -> {rid}",
            flush=True,
        )
        approved = False
        last = None
        shown: tuple[object, object] | None = None
        for _ in range(360):
            status = json.loads(fleetctl(env, "rollouts", "status", rid, "--json"))
            now = (status["phase"], status["wave"], json.dumps(status.get("counts", {})))
            if now != last:
                print(
                    f"   {status['phase']:<10} wave {status['wave']}  devices {now[2]}", flush=True
                )
                last = now
            gate = status.get("gate") or {}
            seen = (status["wave"], gate.get("shadow_n"))
            if gate.get("shadow_n") and seen != shown:
                shown = seen
                print(
                    f"   shadow: {gate['shadow_agree']} of {gate['shadow_n']} sampled frames "
                    f"agree ({gate['shadow_agreement']:.3f}; Wilson 95 % lower bound "
                    f"{gate['shadow_lower']:.3f}, needed 0.9)",
                    flush=True,
                )
            if status["phase"] == "awaiting_approval" and not approved:
                show_webhook(hook, "firing", "rollout_awaiting_approval", rid)
                print(fleetctl(env, "alerts"), flush=True)
                fleetctl(env, "rollouts", "approve", rid)
                print(f"== fleetctl rollouts approve {rid}", flush=True)
                approved = True
            if status["phase"] in (
                "completed",
                "completed_partial",
                "paused",
                "cancelled",
                "rolling_back",
                "rolled_back",
            ):
                if status.get("reason"):
                    print(f"   reason: {status['reason']}", flush=True)
                break
            time.sleep(0.5)
        if approved:
            show_webhook(hook, "resolved", "rollout_awaiting_approval", rid)
        if str(status.get("reason", "")).startswith("gate failed"):
            show_webhook(hook, "firing", "rollout_gate_stopped", rid)  # a gate stopped it
        time.sleep(3)
        print(fleetctl(env, "devices", "list"), flush=True)
        show_review(env, AGENTS[0])
        show_remote(env, d, AGENTS[0])
        line_plc.stop()
        line_plc.report()
    finally:
        line_plc.stop()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(20)
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        hook.stop()
        local.stop()
        plc.close()
    for dev in AGENTS:
        lines = (d / "agents" / dev / "echo.log").read_text().splitlines()
        decided = [x for x in lines if " cam1 " in x]
        old = sum(" text-det 4.0.0 " in x for x in decided)
        new = sum(" text-det 4.0.1 " in x for x in decided)
        print(f"== {dev}: {len(decided)} decisions, {old} with text-det 4.0.0, {new} with 4.0.1")
        for x in [y for y in decided if " 4.0.1 " in y][:2]:
            print("   " + x)
    cfg = d / "agents" / STATION_AGENT / "agent.toml"
    print(f"\n$ edge-agent decisions --config {cfg} --station label-gate --limit 4")
    print(
        run(
            [
                str(BIN / "edge-agent"),
                "decisions",
                "--config",
                str(cfg),
                "--station",
                "label-gate",
                "--limit",
                "4",
            ],
            env,
        )
    )
    cfg = d / "agents" / AGENTS[1] / "agent.toml"
    print(f"\n$ edge-agent decisions --config {cfg} --outcome reject --limit 3")
    print(
        run(
            [
                str(BIN / "edge-agent"),
                "decisions",
                "--config",
                str(cfg),
                "--outcome",
                "reject",
                "--limit",
                "3",
            ],
            env,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
