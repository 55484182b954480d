"""Remote actions on a real ``edge-agent run`` (supervisor, hot path, companion) with a
real Mosquitto and the fleet's repository served over it: requests signed by the
director key, answered by the companion, refused with a clear reason when forged,
tampered, expired, replayed or for another device, and then nothing is done."""

from __future__ import annotations

import calendar
import io
import json
import tarfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from agent.remote.counter import COUNTER_FILE
from agent.supervisor import EXIT_RESTART
from fleet_server.repository.director import issue_directive
from tests.agent.installer.installer_helpers import make_bundle
from tests.agent.remote.remote_support import (
    HELD_SECRET,
    PROFILE,
    Fleet,
    RunningAgent,
    forged,
    make_agent,
    make_fleet,
    wait_for,
)
from tests.support.notify import NotifyListener

DEVICE = "cam-1"
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet, files = make_fleet(tmp_path_factory.mktemp("fleet"))
    yield fleet
    fleet.stop()
    files.stop()
    fleet.broker.stop()


@pytest.fixture(scope="module")
def agent(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    running = make_agent(fleet, tmp_path_factory.mktemp("agent") / DEVICE, DEVICE).start()
    yield running
    running.stop()


def _counter_file(agent: RunningAgent) -> bytes:
    """The handled counter as the device keeps it (b"" before the first request)."""
    path = agent.state / "trust" / COUNTER_FILE
    return path.read_bytes() if path.exists() else b""


def _stamp() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"


def test_logs_come_in_chunks_with_the_secrets_taken_out(fleet: Fleet, agent: RunningAgent) -> None:
    # what a library of the hot path might log: a password in a URL, a key=value token,
    # and the broker password the agent holds (named by password_env) in plain text
    line = (
        f"{_stamp()} hotpath WARNING vendor.camera: open rtsp://admin:Cam3raPw@10.0.0.7/s "
        f"failed; api_token=tok-5521aa retry with {HELD_SECRET}\n"
    )
    with (agent.state / "logs" / "hotpath.log").open("a", encoding="utf-8") as f:
        f.write(line)
    rid = fleet.request(DEVICE, "logs", {"lines": 200, "since_s": 600})
    answer = fleet.final(rid)
    assert answer["status"] == "ok", answer
    text = fleet.data_of(rid).decode()
    assert answer["bytes"] == len(text.encode())
    assert answer["chunks"] >= 1
    assert (
        "vendor.camera: open rtsp://admin:***@10.0.0.7/s failed; api_token=*** retry with ***"
        in text
    )
    for secret in ("Cam3raPw", "tok-5521aa", HELD_SECRET):
        assert secret not in text
    assert "remote actions: listening" in text  # the companion's own lines are there
    assert answer["detail"]["source"] == "file"
    assert answer["detail"]["redacted"] >= 3
    statuses = [a["status"] for a in fleet.answers_of(rid)]
    assert statuses == ["accepted", "ok"]


def test_logs_are_filtered_and_bounded_as_asked(fleet: Fleet, agent: RunningAgent) -> None:
    rid = fleet.request(DEVICE, "logs", {"lines": 2, "grep": "hotpath: pid"})
    answer = fleet.final(rid)
    lines = fleet.data_of(rid).decode().splitlines()
    assert answer["status"] == "ok"
    assert answer["detail"]["lines"] == len(lines) >= 1
    assert len(lines) <= 2
    assert all("hotpath: pid" in x for x in lines)


def test_follow_sends_the_lines_written_after_the_request(
    fleet: Fleet, agent: RunningAgent
) -> None:
    rid = fleet.request(DEVICE, "logs", {"lines": 1, "grep": "follow-marker", "follow_s": 3})
    wait_for(lambda: any(a["status"] == "running" for a in fleet.answers_of(rid)), 20, "running")
    with (agent.state / "logs" / "hotpath.log").open("a", encoding="utf-8") as f:
        f.write(f"{_stamp()} hotpath INFO test: follow-marker written later\n")
    answer = fleet.final(rid)
    assert answer["status"] == "ok"
    assert answer["detail"]["follow_s"] == 3
    assert "follow-marker written later" in fleet.data_of(rid).decode()


def test_diagnostics_archive_holds_each_part_without_secrets(
    fleet: Fleet, agent: RunningAgent
) -> None:
    rid = fleet.request(DEVICE, "diagnostics", {"lines": 50})
    answer = fleet.final(rid)
    assert answer["status"] == "ok", answer
    data = fleet.data_of(rid)
    assert len(data) == answer["bytes"]
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        files = {m.name.removeprefix("diagnostics/"): tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]
    assert set(files) == {"versions.json", "config.json", "health.json", "ready.json",
                          "processes.json", "disk.json", "decision-log.json", "logs.txt",
                          "MANIFEST.json"}  # fmt: skip
    versions = json.loads(files["versions.json"])
    assert versions["agent"]
    assert versions["python"]
    assert versions["profile"] == PROFILE
    config = json.loads(files["config.json"])
    assert config["agent"]["device_id"] == DEVICE
    assert config["bundles"]["mqtt"]["password_env"]  # the name of the secret, not it
    assert json.loads(files["decision-log.json"])["quick_check"] == ["ok"]
    disk = json.loads(files["disk.json"])
    assert disk["free_mb"] > 0
    assert "logs" in disk["parts_mb"]
    assert json.loads(files["processes.json"])["pid"] > 0
    assert "remote actions: listening" in files["logs.txt"].decode()
    manifest = json.loads(files["MANIFEST.json"])
    assert set(manifest) == set(files) - {"MANIFEST.json"}
    for blob in files.values():
        assert HELD_SECRET.encode() not in blob


def test_forged_tampered_foreign_and_misplaced_requests_are_refused_and_nothing_runs(
    fleet: Fleet, agent: RunningAgent, tmp_path: Path
) -> None:
    before = (agent.hello(), _counter_file(agent))
    cases = {"forged-1": (forged(tmp_path, DEVICE, "restart", "forged-1"), "not signed by")}
    rid, data = fleet.sign(DEVICE, "restart", request_id="tampered-1")
    cases[rid] = (data.replace(b'"restart"', b'"reload"'), "not signed by the director")
    rid, data = fleet.sign("cam-2", "restart", request_id="foreign-1")
    cases[rid] = (data, "for device 'cam-2', this is 'cam-1'")
    bundle = make_bundle(tmp_path, name="cls", version="1.0.0", release=1)
    fleet.repo.publish(bundle.path, fleet.keys)
    directive = issue_directive(fleet.repo, fleet.keys, DEVICE, PROFILE, "cls", 1, counter=900)
    cases["unknown"] = (directive, "not an action request")
    for rid, (data, _) in cases.items():
        fleet.publish(DEVICE, data, retain=False)
        answer = fleet.final(rid)
        assert answer["status"] == "refused", answer
    for rid, (_, reason) in cases.items():
        assert reason in fleet.final(rid)["reason"]
        assert [a["status"] for a in fleet.answers_of(rid)] == ["refused"]
    assert (agent.hello(), _counter_file(agent)) == before
    assert not [c for c in fleet.chunks if c["request_id"] in cases]


def test_a_replayed_or_older_request_is_refused_and_the_retained_copy_is_not_answered(
    fleet: Fleet, agent: RunningAgent
) -> None:
    rid, data = fleet.sign(DEVICE, "logs", {"lines": 1})
    fleet.publish(DEVICE, data)
    assert fleet.final(rid)["status"] == "ok"
    older_rid, older = fleet.sign(DEVICE, "restart", counter=1)
    pids = agent.hello()
    fleet.publish(DEVICE, data, retain=False)  # the same request again, sent by hand
    wait_for(lambda: len(fleet.answers_of(rid)) == 3, 20, "the replay's answer")
    replay = fleet.answers_of(rid)[-1]
    assert replay["status"] == "refused", replay
    assert "replayed" in replay["reason"], replay
    fleet.publish(DEVICE, older, retain=False)
    refused = fleet.final(older_rid)
    assert refused["status"] == "refused"
    assert "is not above" in refused["reason"], refused
    assert agent.hello() == pids


def test_an_expired_request_is_refused_and_nothing_runs(fleet: Fleet, agent: RunningAgent) -> None:
    pids = agent.hello()
    rid, data = fleet.sign(DEVICE, "restart", expires_in=timedelta(seconds=-5))
    fleet.publish(DEVICE, data, retain=False)
    answer = fleet.final(rid)
    assert answer["status"] == "refused", answer
    assert answer["reason"].startswith("expired at"), answer
    assert agent.hello() == pids


def test_restart_restarts_the_hot_path_and_the_companion(fleet: Fleet, agent: RunningAgent) -> None:
    before = agent.hello()
    assert before is not None
    rid = fleet.request(DEVICE, "restart")
    answer = fleet.final(rid, timeout_s=60)
    assert answer["status"] == "ok", answer
    assert answer["reason"].startswith("restarted:")
    after = wait_for(lambda: (h := agent.hello()) and h != before and h, 30, "new processes")
    assert after["hotpath"] != before["hotpath"]
    assert after["companion"] != before["companion"]
    assert answer["detail"]["after"]["pid"] == after["hotpath"]
    assert answer["detail"]["before"]["pid"] == before["hotpath"]
    assert [a["status"] for a in fleet.answers_of(rid)] == ["accepted", "running", "ok"]


def test_reload_takes_a_good_configuration_and_refuses_a_broken_one(
    fleet: Fleet, agent: RunningAgent
) -> None:
    good = agent.config.read_text()
    agent.config.write_text(good + "[remote]\nmax_lines = 0\n")
    pids = agent.hello()
    try:
        rid = fleet.request(DEVICE, "reload")
        answer = fleet.final(rid)
    finally:
        agent.config.write_text(good)
    assert answer["status"] == "failed", answer
    assert "the configuration does not load; nothing changed" in answer["reason"]
    assert "remote.max_lines" in answer["reason"]
    assert agent.hello() == pids
    agent.config.write_text(good + "[remote]\nmax_lines = 1500\n")
    try:
        rid = fleet.request(DEVICE, "reload")
        answer = fleet.final(rid, timeout_s=60)
    finally:
        agent.config.write_text(good)
    assert answer["status"] == "ok", answer
    assert answer["reason"].startswith("reloaded: configuration")
    running = fleet.answers_of(rid)[1]
    assert running["status"] == "running"
    assert answer["detail"]["config_digest"] != answer["detail"]["config_before"]
    wait_for(lambda: agent.hello() != pids, 30, "new processes")


def test_a_request_made_while_the_agent_is_down_is_answered_when_it_comes_back(
    fleet: Fleet, tmp_path: Path
) -> None:
    late = make_agent(fleet, tmp_path / "cam-9", "cam-9")
    rid = fleet.request("cam-9", "logs", {"lines": 5})  # retained: there when it connects
    late.start()
    try:
        answer = fleet.final(rid)
        assert answer["status"] == "ok"
        assert answer["detail"]["lines"] >= 1
    finally:
        late.stop()


def _past(request: bytes) -> bool:
    expires = json.loads(request)["signed"]["expires"]
    return time.time() > calendar.timegm(time.strptime(expires, "%Y-%m-%dT%H:%M:%SZ"))


def test_under_systemd_a_restart_exits_for_the_unit_and_the_next_start_answers_it(
    fleet: Fleet, tmp_path: Path
) -> None:
    systemd = NotifyListener()
    unit = make_agent(fleet, tmp_path / "cam-8", "cam-8")
    unit.env = systemd.env()
    unit.start()
    try:
        rid = fleet.request("cam-8", "restart")
        assert unit.proc is not None
        assert unit.proc.wait(30) == EXIT_RESTART  # the unit's RestartForceExitStatus
        assert [a["status"] for a in fleet.answers_of(rid)] == ["accepted", "running"]
        # while it is down a request comes that expires before it is back (the fleet
        # also gives the retained message its expiry, and the broker drops it then)
        gone_rid, gone = fleet.sign("cam-8", "diagnostics", expires_in=timedelta(seconds=1))
        fleet.publish("cam-8", gone)
        wait_for(lambda: _past(gone), 10, "the request's expiry")
        unit.start()  # what systemd does on that status
        answer = fleet.final(rid)
        assert answer["status"] == "ok", answer
        assert answer["reason"].startswith("restarted:")
        expired = fleet.final(gone_rid)
        assert expired["status"] == "refused"
        assert expired["reason"].startswith("expired at")
        assert not fleet.data_of(gone_rid)
        assert any("STOPPING" in m.fields for m in systemd.receive(0.1) + systemd.messages)
    finally:
        unit.stop()
        systemd.sock.close()
