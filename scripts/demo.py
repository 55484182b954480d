"""``make demo``: an agent inspecting label orientation on a looped video.

What it does (each step is skipped when its output already exists):

1. draws a 12 s conveyor video (640x480, 15 fps): label cards move past the camera,
   every fourth one upside down;
2. turns two real pretrained models from ``make models`` into bundles with
   ``fleetctl bundle init`` and edits their manifests: PP-OCRv4 text detection (a
   probability map -> text boxes) and the PP-OCR text-direction classifier (0 / 180
   degrees) run on each detected text box;
3. starts a Mosquitto on a free loopback port for the robot topic;
4. makes a fleet: an encrypted keystore (a passphrase made for this run only), a TUF
   repository, and text-det release 2 published and signed; a file server answers the
   agent's fetches over MQTT;
5. runs ``edge-agent run --echo`` on it for ``--duration`` seconds: every decision is
   printed live, rejects are published on ``factory/<line>/<camera>/<outcome>``; a few
   seconds in, the fleet's signed directive assigns text-det release 2 to the device,
   and the agent verifies, installs, health-checks and commits it while it runs;
6. shows the install report and how to query the decision log.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from hil.demo_assets import edit_manifest, prepare
from hil.loopback import start_broker

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


CONFIG = """# The demo agent: one camera (a looped video), PP-OCRv4 text detection, then the text
# direction classifier on each text box. A label read upside down is a reject.
[agent]
device_id = "{device}"
state_dir = "state"
log_level = "warning"

[runtime]
workers = 2

[mqtt]
port = {port}

[http]
port = 0

[[cameras]]
name = "cam1"
kind = "file"
uri = "line.avi"
fps = 15
loop = true
line = "line1"

[[pipelines]]
name = "label-orientation"
source = "cam1"
installed = "text-det"                   # the signed, installed bundle once there is one
bundle = "bundles/text-det"              # until then
chain = [{{ bundle = "bundles/text-cls", max_crops = 4, padding = 0.1 }}]

[pipelines.policy]
default = "pass"
rules = [
  {{ outcome = "review", min_count = 0, max_count = 0 }},   # no label in view
  {{ outcome = "reject", label = "180", min_score = 0.8 }}, # a label upside down
  {{ outcome = "review", max_score = 0.8 }},                # direction unsure
]

[bundles]
enabled = true
mqtt = {{ port = {port} }}
initial_root = "fleet/repo/metadata/1.root.json"
installer = {{ health_window_s = 3.0, benchmark_runs = 5 }}

[[actions.actions]]
name = "robot"
kind = "mqtt"
topic = "factory/{{line}}/{{source}}/{{outcome}}"
qos = 1
outcomes = ["reject"]
"""


DEVICE = "demo-gateway"


def make_fleet(demo: Path) -> dict[str, str]:
    """Keys, repository and a signed text-det release 2; returns the environment with
    this run's passphrase (never written anywhere)."""
    fleet = demo / "fleet"
    shutil.rmtree(fleet, ignore_errors=True)
    env = os.environ | {"EDGEFLEET_KEY_PASSPHRASE": secrets.token_urlsafe(24)}
    fleetctl = str(BIN / "fleetctl")
    keys, repo = str(fleet / "keys"), str(fleet / "repo")

    def run(*args: str) -> None:
        subprocess.run([fleetctl, *args], check=True, env=env, stdout=subprocess.DEVNULL)

    run("keys", "init", "--keystore", keys)
    run("repo", "init", "--repo", repo, "--keystore", keys)
    r2 = fleet / "text-det-r2"
    shutil.copytree(demo / "bundles" / "text-det", r2)
    edit_manifest(r2 / "manifest.json", version="4.0.1", release=2, latency_budget_ms=1000.0)
    run("bundle", "publish", str(r2), "--repo", repo, "--keystore", keys)
    print(f"== fleet: keys in {keys} (encrypted), text-det 4.0.1 release 2 signed in {repo}")
    return env


def assign_later(demo: Path, env: dict[str, str], port: int, delay_s: float) -> None:
    """After ``delay_s``: sign a directive for this device and publish it (retained)."""
    time.sleep(delay_s)
    fleet = demo / "fleet"
    out = fleet / "directive.json"
    subprocess.run(
        [
            str(BIN / "fleetctl"),
            "directive",
            "issue",
            "--repo",
            str(fleet / "repo"),
            "--keystore",
            str(fleet / "keys"),
            "--device",
            DEVICE,
            "--hardware-class",
            os.environ.get("EDGEFLEET_PROFILE", "x86-gateway"),
            "--bundle",
            "text-det",
            "--release",
            "2",
            "--out",
            str(out),
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    print(
        "\n== fleet: signed directive 'text-det release 2 -> demo-gateway' published\n", flush=True
    )
    subprocess.run(
        [
            shutil.which("mosquitto_pub") or "mosquitto_pub",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-t",
            f"edgefleet/devices/{DEVICE}/directive",
            "-r",
            "-q",
            "1",
            "-f",
            str(out),
        ],
        check=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=str(ROOT / ".cache/models"))
    ap.add_argument("--dir", default=str(ROOT / ".cache/demo"))
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--prepare-only", action="store_true", help="video and bundles only")
    args = ap.parse_args()
    demo = Path(args.dir)
    prepare(demo, Path(args.models))
    if args.prepare_only:
        return 0
    shutil.rmtree(demo / "state", ignore_errors=True)  # each demo starts a fresh device
    env = make_fleet(demo)
    broker = start_broker(demo)
    port = broker.port
    sub = subprocess.Popen(  # shows what the robot and the fleet receive
        [
            shutil.which("mosquitto_sub") or "mosquitto_sub",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-t",
            "factory/#",
            "-t",
            f"edgefleet/devices/{DEVICE}/install/state",
            "-v",
        ],
        stdout=(demo / "robot.log").open("wb"),
    )
    from fleet_server.distribution.file_server import MqttFileServer  # noqa: PLC0415

    files = MqttFileServer(demo / "fleet" / "repo", "127.0.0.1", port)
    files.start(10)
    threading.Thread(
        target=assign_later, args=(demo, env, port, min(6.0, args.duration / 3)), daemon=True
    ).start()
    config = demo / "agent.toml"
    config.write_text(CONFIG.format(port=port, device=DEVICE))
    agent = str(BIN / "edge-agent")
    try:
        print(f"== edge-agent run --config {config} --echo  ({args.duration:g} s)", flush=True)
        subprocess.run(
            [agent, "run", "--config", str(config), "--echo", "--duration", str(args.duration)],
            check=True,
        )
    finally:
        files.stop()
        sub.terminate()
        sub.wait(5)
        broker.stop()
    lines = (demo / "robot.log").read_text().splitlines()
    robot = [line for line in lines if line.startswith("factory/")]
    installs = [line for line in lines if "/install/state" in line]
    print(f"\n== the robot topic got {len(robot)} message(s); the first:")
    print("   " + (robot[0][:160] if robot else "(none)"))
    print("\n== the device's install report (retained, for the rollout controller):")
    print("   " + (installs[-1][:300] if installs else "(none)"))
    print(f"\n$ edge-agent bundles --config {config}")
    subprocess.run([agent, "bundles", "--config", str(config)], check=True)
    print("\n== the decision log: latest rejects")
    print(f"$ edge-agent decisions --config {config} --outcome reject --limit 5")
    subprocess.run(
        [agent, "decisions", "--config", str(config), "--outcome", "reject", "--limit", "5"],
        check=True,
    )
    db = demo / "state" / "decisions.db"
    print("\n== or with sqlite3:")
    query = "SELECT outcome, count(*) FROM decisions GROUP BY outcome"
    print(f'$ sqlite3 {db} "{query}"')
    if shutil.which("sqlite3"):
        subprocess.run(
            ["sqlite3", str(db), query],
            check=True,
        )
    from agent.decisionlog.query import query as query_log  # noqa: PLC0415 - the venv's

    rejects = query_log(db, outcome="reject", limit=1)
    if rejects:
        print("\n== one decision in full, with its thumbnail:")
        print(f"$ edge-agent decisions show {rejects[0]['id']} --config {config}")
        subprocess.run(
            [agent, "decisions", "show", rejects[0]["id"], "--config", str(config)], check=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
