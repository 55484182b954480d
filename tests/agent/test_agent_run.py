"""The agent as a process: config errors, a full run on a real pool with a real broker,
SIGTERM within 5 s, SIGKILL during heavy logging, and parts that fail alone."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import paho.mqtt.client as mqtt
import pytest
from onnx import TensorProto, helper, numpy_helper

from agent.config import load_config
from agent.kernel.bundle import init_bundle
from agent.kernel.errors import ConfigError
from agent.wire.jpeg import jpeg_size
from tests.support.broker import Broker, free_port

BIN = Path(sys.executable).parent
EDGE_AGENT = str(BIN / "edge-agent")


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def brightness_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image classifier of known behaviour: class 1 ("bright") when the image's mean
    exceeds 0.5, by a softmax over [0.5 - mean, mean - 0.5] * 20."""
    d = tmp_path_factory.mktemp("bright")
    w = numpy_helper.from_array(np.array([[-20.0, 20.0]] * 3, np.float32) / 3, "w")
    b = numpy_helper.from_array(np.array([10.0, -10.0], np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["x"], ["m"], axes=[2, 3], keepdims=0),
            helper.make_node("MatMul", ["m", "w"], ["mw"]),
            helper.make_node("Add", ["mw", "b"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["prob"], axis=1),
        ],
        "bright",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 2])],
        initializer=[w, b],
    )
    model = _save(graph, d / "bright.onnx")
    bundle = init_bundle(model, d / "bundle", name="bright", version="1.2.3")
    manifest = json.loads((bundle.path / "manifest.json").read_text())
    manifest["postprocess"]["labels"] = ["dark", "bright"]
    manifest["policy"] = {"rules": [{"outcome": "reject", "label": "dark"}], "default": "pass"}
    (bundle.path / "manifest.json").write_text(json.dumps(manifest))
    return bundle.path


@pytest.fixture(scope="module")
def sensor_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A time-series model: the mean of a window of 4 readings of 2 fields."""
    d = tmp_path_factory.mktemp("sensor") / "bundle"
    d.mkdir()
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["score"], keepdims=0)],
        "mean",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 2])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, [])],
    )
    model = _save(graph, d / "mean.onnx")
    import hashlib

    data = model.read_bytes()
    manifest = {
        "name": "vibration",
        "version": "0.1.0",
        "release": 1,
        "models": {
            "onnx": {
                "file": "mean.onnx",
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
            }
        },
        "input": {"name": "x", "shape": [1, 4, 2], "dtype": "float32"},
        "postprocess": {"kind": "score", "label": "anomaly"},
        "policy": {"rules": [{"outcome": "review", "min_score": 5.0}], "default": "pass"},
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


def _config(tmp: Path, body: str) -> Path:
    path = tmp / "agent.toml"
    path.write_text(
        f'[agent]\ndevice_id = "test-dev"\nstate_dir = "state"\nprofile = "x86-gateway"\n'
        f"[runtime]\nworkers = 1\npin = false\n{body}"
    )
    return path


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EDGE_AGENT, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _rows(db: Path) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return int(con.execute("SELECT count(*) FROM decisions").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        con.close()


def _wait(cond: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


# -- configuration ---------------------------------------------------------------------
def test_a_disk_budget_smaller_than_its_shares_is_refused_naming_them(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        '[agent]\ndevice_id = "d"\nstate_dir = "s"\ndisk_budget_mb = 600\n'
        "[decision_log]\nbudget_mb = 512\n[uplink]\nenabled = true\noutbox_max_mb = 100\n"
    )
    with pytest.raises(ConfigError, match=r"agent.disk_budget_mb: 600 MiB is less than .* 612"):
        load_config(cfg)
    cfg.write_text(cfg.read_text().replace("= 600", "= 612"))
    assert load_config(cfg).agent.disk_budget_mb == 612


def test_thumbnails_larger_than_an_upload_carries_are_refused_unless_uploads_are_off(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "agent.toml"
    body = (
        '[agent]\ndevice_id = "d"\nstate_dir = "s"\n'
        "[decision_log]\nthumbnail_max_bytes = 300000\n[uplink]\nenabled = true\n"
    )
    cfg.write_text(body)
    with pytest.raises(ConfigError, match=r"thumbnail_max_bytes: 300000 bytes is over the 262144"):
        load_config(cfg)
    cfg.write_text(body + "upload_thumbnails = false\n")
    assert load_config(cfg).decision_log.thumbnail_max_bytes == 300000


def test_unknown_key_is_refused_with_file_and_field(tmp_path: Path) -> None:
    cfg = _config(tmp_path, '[[cameras]]\nname = "c1"\nkind = "synthetic"\nfsp = 5\n')
    r = _run("check-config", "--config", str(cfg))
    assert r.returncode == 2
    assert f"{cfg}: cameras[0].fsp: unknown key" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_toml_and_missing_file_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent\n")
    r = _run("check-config", "--config", str(bad))
    assert r.returncode == 2
    assert "not valid TOML" in r.stderr
    r = _run("check-config", "--config", str(tmp_path / "none.toml"))
    assert r.returncode == 2
    assert "can't read" in r.stderr


def test_pipeline_source_and_line_outcomes_are_cross_checked(
    tmp_path: Path, brightness_bundle: Path
) -> None:
    cfg = _config(
        tmp_path,
        f'[[cameras]]\nname = "c1"\nkind = "synthetic"\nline = "l1"\n'
        f'[lines.l1]\noutcomes = ["ok", "scrap"]\n'
        f'[[pipelines]]\nname = "p"\nsource = "c2"\nbundle = "{brightness_bundle}"\n',
    )
    r = _run("check-config", "--config", str(cfg))
    assert r.returncode == 2
    assert "pipelines[0].source: no camera or sensor 'c2'" in r.stderr
    cfg = _config(
        tmp_path,
        f'[[cameras]]\nname = "c1"\nkind = "synthetic"\nline = "l1"\n'
        f'[lines.l1]\noutcomes = ["ok", "scrap"]\n'
        f'[[pipelines]]\nname = "p"\nsource = "c1"\nbundle = "{brightness_bundle}"\n'
        f'[pipelines.policy]\ndefault = "ok"\nrules = [{{ outcome = "reject" }}]\n',
    )
    r = _run("check-config", "--config", str(cfg))
    assert r.returncode == 2
    assert "pipelines[0].policy: outcome(s) ['reject'] not defined by line 'l1'" in r.stderr


def test_check_config_reports_a_missing_bundle(tmp_path: Path) -> None:
    cfg = _config(
        tmp_path,
        '[[cameras]]\nname = "c1"\nkind = "synthetic"\n'
        '[[pipelines]]\nname = "p"\nsource = "c1"\nbundle = "nowhere"\n',
    )
    r = _run("check-config", "--config", str(cfg), "--json")
    assert r.returncode == 2
    report = json.loads(r.stdout)
    assert report["problems"]
    assert "pipeline p" in report["problems"][0]
    assert "nowhere" in report["problems"][0]


# -- a whole run -------------------------------------------------------------------------
@pytest.fixture
def robot(mosquitto: Broker) -> Iterator[list[mqtt.MQTTMessage]]:
    got: list[mqtt.MQTTMessage] = []
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="robot-test")
    c.on_message = lambda _c, _u, msg: got.append(msg)
    c.connect(mosquitto.host, mosquitto.port)
    c.subscribe("factory/#", qos=1)
    c.loop_start()
    time.sleep(0.3)
    yield got
    c.loop_stop()
    c.disconnect()


def _scrape(port: int, within_s: float = 20.0) -> str:
    """/metrics once the companion serves it (it starts after the hot path answers, so
    the first decisions can come before it listens)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return str(r.read().decode())
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_agent_decides_logs_publishes_and_stops_on_sigterm_within_5s(
    tmp_path: Path, brightness_bundle: Path, mosquitto: Broker, robot: list[mqtt.MQTTMessage]
) -> None:
    port = free_port()
    cfg = _config(
        tmp_path,
        f"[mqtt]\nport = {mosquitto.port}\n[http]\nport = {port}\n"
        '[[cameras]]\nname = "dark-cam"\nkind = "synthetic"\nfps = 30\nline = "l1"\n'
        '[[cameras]]\nname = "broken"\nkind = "http"\nuri = "http://127.0.0.1:9/none"\n'
        f'[[pipelines]]\nname = "p1"\nsource = "dark-cam"\nbundle = "{brightness_bundle}"\n'
        f'[[pipelines]]\nname = "p2"\nsource = "broken"\nbundle = "{brightness_bundle}"\n'
        '[[actions.actions]]\nname = "robot"\nkind = "mqtt"\n'
        'topic = "factory/{line}/{source}/{outcome}"\noutcomes = ["reject"]\n',
    )
    proc = subprocess.Popen(
        [EDGE_AGENT, "run", "--config", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    db = tmp_path / "state" / "decisions.db"
    try:
        # The synthetic pattern is mostly dark: class "dark" -> reject by the bundle policy.
        assert _wait(lambda: db.exists() and _rows(db) >= 10, 30), "no decisions logged"
        assert _wait(lambda: len(robot) >= 3, 10), "nothing published to the robot topic"
        metrics = _scrape(port)
    finally:
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=10)
        stop_s = time.monotonic() - t0
    assert proc.returncode == 0, err.decode()
    assert stop_s < 5.0, f"took {stop_s:.1f} s to stop"
    msg = robot[0]
    assert msg.topic == "factory/l1/dark-cam/reject"
    payload = json.loads(msg.payload)
    assert payload["outcome"] == "reject"
    assert payload["label"] == "dark"
    # the camera that never opens is reported down; the other pipeline was not affected
    assert 'edgefleet_camera_up{camera="broken"} 0.0' in metrics
    assert 'edgefleet_decisions_total{outcome="reject",pipeline="p1"}' in metrics
    rows = _run("decisions", "--config", str(cfg), "--format", "jsonl", "--limit", "1000")
    assert rows.returncode == 0, rows.stderr
    logged = [json.loads(line) for line in rows.stdout.splitlines()]
    assert len(logged) == _rows(db) >= 10
    first = logged[-1]
    assert first["device_id"] == "test-dev"
    assert first["source"] == "dark-cam"
    assert first["model_name"] == "bright"
    assert first["model_version"] == "1.2.3"
    assert first["outcome"] == "reject"
    assert first["thumbnail"], "a reject gets a thumbnail"
    shown = _run("decisions", "show", first["id"], "--config", str(cfg))
    assert shown.returncode == 0, shown.stderr
    thumb = Path(json.loads(shown.stdout)["thumbnail_path"])
    assert thumb.is_file()
    assert thumb.read_bytes()[:2] == b"\xff\xd8"  # a JPEG
    # the frame's size goes with the outputs: boxes in frame pixels fit any thumbnail
    outputs = first["outputs"]
    frame = (json.loads(outputs) if isinstance(outputs, str) else outputs)["frame"]
    assert frame == {"width": 640, "height": 480}
    assert jpeg_size(thumb.read_bytes()) == (320, 240)


@pytest.mark.parametrize("mode", ["supervised", "single-process"])
def test_sighup_loads_the_pipelines_again_and_sigterm_still_stops(
    tmp_path: Path, brightness_bundle: Path, mode: str
) -> None:
    """``systemctl reload`` (ExecReload=kill -HUP): the pipelines load again and decide on;
    the signals reach the main loop through agent.kernel.signals, never a lock held."""
    cfg = _config(
        tmp_path,
        "[http]\nport = 0\n[decision_log]\nflush_interval_s = 0.05\n"
        '[[cameras]]\nname = "c1"\nkind = "synthetic"\nfps = 50\nwidth = 64\nheight = 48\n'
        f'[[pipelines]]\nname = "p"\nsource = "c1"\nbundle = "{brightness_bundle}"\n',
    )
    db = tmp_path / "state" / "decisions.db"
    err = tmp_path / "agent.log"
    extra = ["--single-process"] if mode == "single-process" else []
    with err.open("wb") as out:
        proc = subprocess.Popen(
            [EDGE_AGENT, "run", *extra, "--config", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=out,
            start_new_session=True,
        )
    try:
        assert _wait(lambda: db.exists() and _rows(db) >= 5, 60), err.read_text()
        proc.send_signal(signal.SIGHUP)
        assert _wait(lambda: "loaded again" in err.read_text(errors="replace"), 60), err.read_text(
            errors="replace"
        )
        after = _rows(db)
        assert _wait(lambda: _rows(db) >= after + 5, 30), "no decisions after the reload"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert code == 0, err.read_text(errors="replace")


def test_sensor_pipeline_with_garbage_lines_keeps_deciding(
    tmp_path: Path, sensor_bundle: Path
) -> None:
    replay = tmp_path / "vib.csv"
    lines = ["x,y"] + [
        "oops,1" if i % 10 == 3 else f"{i % 4},{10 if i >= 20 else 0}" for i in range(40)
    ]
    replay.write_text("\n".join(lines) + "\n")
    cfg = _config(
        tmp_path,
        "[http]\nport = 0\n"
        f'[[sensors]]\nname = "vib"\nkind = "replay"\npath = "{replay}"\nfields = ["x", "y"]\n'
        "window = 4\nstride = 1\nrate_hz = 200\nloop = false\n"
        f'[[pipelines]]\nname = "vib"\nsource = "vib"\nbundle = "{sensor_bundle}"\n',
    )
    r = _run("run", "--config", str(cfg), "--duration", "3", "--stats")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    assert stats["pipelines"]["vib"]["decided"] > 0
    db = tmp_path / "state" / "decisions.db"
    con = sqlite3.connect(db)
    outcomes = {row[0] for row in con.execute("SELECT outcome FROM decisions")}
    con.close()
    assert outcomes == {"pass", "review"}  # windows of y=0 pass, windows of y=10 review


def test_a_missing_bundle_leaves_the_other_pipeline_running(
    tmp_path: Path, brightness_bundle: Path
) -> None:
    cfg = _config(
        tmp_path,
        "[http]\nport = 0\n"
        '[[cameras]]\nname = "c1"\nkind = "synthetic"\nfps = 30\n'
        '[[cameras]]\nname = "c2"\nkind = "synthetic"\nfps = 30\n'
        f'[[pipelines]]\nname = "good"\nsource = "c1"\nbundle = "{brightness_bundle}"\n'
        '[[pipelines]]\nname = "bad"\nsource = "c2"\nbundle = "gone"\n',
    )
    r = _run("run", "--config", str(cfg), "--duration", "2", "--stats")
    assert r.returncode == 0, r.stderr
    assert "not started: pipeline bad" in r.stderr
    stats = json.loads(r.stdout)
    assert stats["pipelines"]["good"]["decided"] > 0
    assert "bad" not in stats["pipelines"]


def test_sigkill_during_heavy_logging_never_corrupts_the_log(
    tmp_path: Path, brightness_bundle: Path
) -> None:
    cfg = _config(
        tmp_path,
        '[http]\nport = 0\n[decision_log]\nflush_interval_s = 0.05\nthumbnails = "all"\n'
        '[[cameras]]\nname = "c1"\nkind = "synthetic"\nfps = 1000\nwidth = 64\nheight = 48\n'
        f'[[pipelines]]\nname = "p"\nsource = "c1"\nbundle = "{brightness_bundle}"\n',
    )
    db = tmp_path / "state" / "decisions.db"
    last = 0
    rng = np.random.default_rng(7)
    # 8 kills of the whole agent at random moments of heavy logging; the writer alone is
    # killed at many more moments in tests/agent/decisionlog (cheaper than agent starts)
    for i in range(8):
        proc = subprocess.Popen(
            # the writer is the same in one process; one interpreter start a round, not
            # three (tests/agent/test_process_split.py kills the two-process agent)
            [EDGE_AGENT, "run", "--single-process", "--config", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            grew = _wait(lambda floor=last: db.exists() and _rows(db) > floor, 30)
            time.sleep(float(rng.uniform(0.0, 0.3)))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the agent and its workers
            proc.wait(10)
        assert grew, f"round {i}: no new rows"
        con = sqlite3.connect(db)
        try:
            assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok", f"round {i}"
            count = int(con.execute("SELECT count(*) FROM decisions").fetchone()[0])
        finally:
            con.close()
        assert count >= last, f"round {i}: rows went from {last} to {count}"
        last = count
    assert last > 8


def test_a_bundle_for_another_device_class_is_not_started(
    tmp_path: Path, brightness_bundle: Path
) -> None:
    import shutil

    other = tmp_path / "jetson-only"
    shutil.copytree(brightness_bundle, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["profiles"] = ["jetson-orin"]
    (other / "manifest.json").write_text(json.dumps(manifest))
    cfg = _config(
        tmp_path,
        '[[cameras]]\nname = "c1"\nkind = "synthetic"\n'
        f'[[pipelines]]\nname = "p"\nsource = "c1"\nbundle = "{other}"\n',
    )
    r = _run("check-config", "--config", str(cfg))
    assert r.returncode == 2
    assert "x86-gateway" in r.stderr
    assert "pipeline p" in r.stderr


def test_reload_swaps_the_bundle_while_the_camera_keeps_running(
    tmp_path: Path, brightness_bundle: Path
) -> None:
    import shutil

    from agent.app import Agent
    from agent.config import load_config

    # v2: the same model with the labels the other way round: "dark" frames now pass.
    v2 = tmp_path / "v2"
    shutil.copytree(brightness_bundle, v2)
    manifest = json.loads((v2 / "manifest.json").read_text())
    manifest["version"] = "2.0.0"
    manifest["policy"] = {"rules": [{"outcome": "reject", "label": "bright"}], "default": "pass"}
    (v2 / "manifest.json").write_text(json.dumps(manifest))
    cfg = load_config(
        _config(
            tmp_path,
            '[[cameras]]\nname = "c1"\nkind = "synthetic"\nfps = 50\n'
            f'[[pipelines]]\nname = "p"\nsource = "c1"\nbundle = "{brightness_bundle}"\n',
        )
    )
    current = [brightness_bundle]
    seen: list[tuple[str, str]] = []
    agent = Agent(
        cfg,
        http=False,
        resolve=lambda _p: list(current),
        on_decision=lambda d, _id: seen.append((d.record.model_version, d.record.outcome)),
    )
    agent.start()
    try:
        assert _wait(lambda: len(seen) >= 5, 20)
        camera = agent.cameras["c1"]
        old_pool = agent.pool
        current[0] = v2
        agent.reload()
        assert agent.cameras["c1"] is camera
        assert agent.pool is not old_pool
        n = len(seen)
        assert _wait(lambda: any(v == "2.0.0" for v, _ in seen[n:]), 20)
    finally:
        agent.stop()
    assert ("1.2.3", "reject") in seen
    assert ("2.0.0", "pass") in seen
    after = seen[seen.index(("2.0.0", "pass")) :]
    assert all(v == "2.0.0" for v, _ in after)


def test_healthz_and_readyz_name_the_reason_a_camera_is_down(
    tmp_path: Path, brightness_bundle: Path
) -> None:
    from agent.app import Agent

    with socket.socket() as s:  # a port where nothing listens: the camera is refused
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    cfg = load_config(
        _config(
            tmp_path,
            '[[cameras]]\nname = "c1"\nkind = "synthetic"\nfps = 20\n'
            f'[[cameras]]\nname = "door"\nkind = "rtsp"\nuri = "rtsp://127.0.0.1:{closed}/main"\n'
            "open_timeout_s = 1.0\nbackoff_initial_s = 0.2\nbackoff_max_s = 0.5\n"
            f'[[pipelines]]\nname = "p"\nsource = "c1"\nbundle = "{brightness_bundle}"\n'
            f'[[pipelines]]\nname = "q"\nsource = "door"\nbundle = "{brightness_bundle}"\n',
        )
    )
    agent = Agent(cfg, http=False)
    agent.start()
    try:
        assert _wait(lambda: agent.cameras["door"].stats().failures.get("refused", 0) >= 1, 20)
        assert _wait(lambda: agent.cameras["c1"].up, 20)
        alive, health = agent.health()
        ready, readiness = agent.ready()
    finally:
        agent.stop()
    assert alive  # a camera that is down is reopened; the agent is not dead
    door = health["cameras"]["door"]
    assert door["up"] is False
    assert door["failure"] == "refused"
    assert door["failures"]["refused"] >= 1
    assert health["cameras"]["c1"]["failure"] == ""
    assert not ready
    assert readiness["camera_failures"] == {"door": "refused"}
