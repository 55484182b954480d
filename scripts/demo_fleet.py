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
4. ``fleetctl rollouts create --bundle text-det@4.0.1 --waves 1,100% --shadow 90s``: each
   wave first runs the candidate in the device's shadow slot beside the live model on a
   sampled share of the frames (never acting), and switches only when the pooled
   agreement's Wilson lower bound reaches ``--min-agreement``; then the fleet signs the
   switch for cam-a, which verifies, installs, health-checks and commits it, then cam-b;
   the agreement, ``fleetctl rollouts status`` and ``fleetctl devices list`` are printed;
5. a decision of cam-a as the fleet's review API has it, with the thumbnail the agent
   uploaded (what the console's decision page shows);
6. the decisions each agent logged, before and after its switch.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from hil.demo_assets import edit_manifest, prepare
from hil.loopback import free_port, start_broker
from runtime.profiles import load_profile

ROOT = Path(__file__).resolve().parent.parent

BIN = Path(sys.executable).parent
AGENTS = ("cam-a", "cam-b")
SHADOW_MIN = 40
"""Shadow frames a wave needs before its agreement is judged (10 fps, half sampled)."""

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

[[cameras]]
name = "cam1"
kind = "file"
uri = "{video}"
fps = 10
loop = true
line = "1"  # the line it is enrolled on (--labels line=1): drift is kept for that line only

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=str(ROOT / ".cache/models"))
    ap.add_argument("--dir", default=str(ROOT / ".cache/demo"))
    args = ap.parse_args()
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
    }
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
    )
    local = start_broker(d)
    local_port = local.port
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
            cfg.write_text(
                AGENT_CONFIG.format(
                    device=dev, local_port=local_port, video=d / "line.avi", bundles=d / "bundles"
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
                "--json",
            )
        )
        rid = created["rollout_id"]
        print(
            f"== fleetctl rollouts create --bundle text-det@4.0.1 --select line=1 "
            f"--waves 1,100% --soak 3s --shadow 90s --shadow-min {SHADOW_MIN} "
            f"--min-agreement 0.9  -> {rid}",
            flush=True,
        )
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
        time.sleep(3)
        print(fleetctl(env, "devices", "list"), flush=True)
        show_review(env, AGENTS[0])
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(20)
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        local.stop()
    for dev in AGENTS:
        lines = (d / "agents" / dev / "echo.log").read_text().splitlines()
        decided = [x for x in lines if " cam1 " in x]
        old = sum(" text-det 4.0.0 " in x for x in decided)
        new = sum(" text-det 4.0.1 " in x for x in decided)
        print(f"== {dev}: {len(decided)} decisions, {old} with text-det 4.0.0, {new} with 4.0.1")
        for x in [y for y in decided if " 4.0.1 " in y][:2]:
            print("   " + x)
    cfg = d / "agents" / AGENTS[0] / "agent.toml"
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
