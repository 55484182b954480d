"""The agent as an OPC 40100 (Machine Vision) OPC UA server, tested with an independent
stack: node-opcua's client (tests/support/node_opcua/client.js) against a real asyncua
server on a free loopback port, with an application certificate made at test time.

One server for the module (security ``sign``: Sign and SignAndEncrypt endpoints; users
from a secret, one argon2-hashed, one in clear; anonymous read allowed), two stations.
Each test sets the state it needs and checks what a client sees.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import argon2
import pytest

from agent.kernel.errors import ConfigError
from agent.line.errors import LineError
from agent.line.results import StationResult
from agent.line.servers import opcua_model
from agent.line.servers.config import OpcUaServerConfig
from agent.line.servers.opcua import Recipe, VisionServer
from tests.support.broker import free_port
from tests.support.opcua_peer import make_server_identity, run_client

OWN = "urn:edgefleet:test-line"
APP_URI = "urn:edgefleet:test-agent"
USERS_ENV = "EDGEFLEET_TEST_OPCUA_USERS"
PASSWORD = "correct horse battery"  # noqa: S105 - a test user's
PLAIN_PASSWORD = "plain but long password"  # noqa: S105 - a test user's, kept in clear
WRONG_PASSWORD = "not the password"  # noqa: S105
WAIT_S = 15.0
VSM = ["mv:VisionStateMachine"]
AUTO = ["mv:VisionStateMachine", "mv:AutomaticModeStateMachine"]
RECIPES = ["mv:RecipeManagement"]


class Agent:
    """The lead's side of the server: records every callback (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.triggers: list[str] = []
            self.selected: list[tuple[str, str]] = []
            self.commands: list[tuple[str, str]] = []
            self.accept_trigger = True
            self.slow_s = 0.0
            self.active = "a-1"

    def on_trigger(self, station: str, part_id: str = "") -> bool:
        with self.lock:
            self.triggers.append(station)
            accept, slow_s = self.accept_trigger, self.slow_s
        time.sleep(slow_s)
        return accept

    def recipes(self, station: str) -> list[Recipe]:
        with self.lock:
            active = self.active
        return [
            Recipe("a-1", "sorter", "1.0.0", "sha256:" + "a1" * 32, active == "a-1"),
            Recipe("b-2", "sorter", "2.0.0", "sha256:" + "b2" * 32, active == "b-2"),
            Recipe("c-3", "unsigned", "0.1.0", "sha256:" + "c3" * 32, active == "c-3"),
        ]

    def select_recipe(self, station: str, recipe_id: str) -> str | None:
        with self.lock:
            self.selected.append((station, recipe_id))
            if recipe_id == "c-3":
                return "bundle c-3 failed its signature check"
            self.active = recipe_id
            return None

    def on_command(self, station: str, command: str) -> str | None:
        with self.lock:
            self.commands.append((station, command))
        return None


@pytest.fixture(scope="module")
def agent() -> Agent:
    return Agent()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, agent: Agent) -> Iterator[VisionServer]:
    tmp = tmp_path_factory.mktemp("opcua-server")
    cert, key = make_server_identity(tmp, APP_URI)
    hashed = argon2.PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1).hash(PASSWORD)
    os.environ[USERS_ENV] = f"# test users\noperator:{hashed}\nplain:{PLAIN_PASSWORD}\n"
    config = OpcUaServerConfig(
        enabled=True,
        port=free_port(),
        security="sign",
        certificate=cert,
        private_key=key,
        application_uri=APP_URI,
        users_env=USERS_ENV,
        allow_anonymous_read=True,
        namespace_uri=OWN,
        recipe_refresh_s=0.5,
        callback_timeout_s=1.0,
    )
    srv = VisionServer(
        config,
        ["st1", "st2"],
        on_trigger=agent.on_trigger,
        recipes=agent.recipes,
        select_recipe=agent.select_recipe,
        on_command=agent.on_command,
    )
    try:
        srv.start(timeout_s=60.0)
        yield srv
    finally:
        srv.stop()
        os.environ.pop(USERS_ENV, None)


@pytest.fixture
def fresh(agent: Agent) -> Agent:
    agent.reset()
    return agent


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """node-opcua's own PKI folder (it makes its client certificate there once)."""
    return tmp_path_factory.mktemp("node-opcua-pki")


def _plan(
    server: VisionServer, pki: Path, steps: list[dict[str, Any]], **kw: Any
) -> dict[str, Any]:
    return {
        "endpoint": server.endpoint,
        "own": OWN,
        "pki": str(pki),
        "security": "SignAndEncrypt",
        "steps": steps,
        **kw,
    }


def _operator(**kw: Any) -> dict[str, Any]:
    return {"user": "operator", "password": PASSWORD, **kw}


def _wait_stat(server: VisionServer, name: str, at_least: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while server.stats()[name] < at_least:
        assert time.monotonic() < deadline, f"{name} stayed below {at_least}: {server.stats()}"
        time.sleep(0.02)


def _set_state(server: VisionServer, station: str, state: str) -> None:
    before = server.stats()["states_set"]
    server.set_state(station, state)
    _wait_stat(server, "states_set", before + 1)


def _result(station: str, seq: int, **kw: Any) -> StationResult:
    fields: dict[str, Any] = {
        "station": station,
        "seq": seq,
        "trigger_seq": seq,
        "status": "ok",
        "outcome": "pass",
        "outcome_code": 1,
        "score": 0.97,
        "label": "good",
        "part_id": f"PART-{seq}",
        "decision_id": f"dec-{station}-{seq}",
        "model_name": "sorter",
        "model_version": "1.0.0",
        "trigger_to_result_ms": 12.5,
        "wall_time": time.time(),
    }
    fields.update(kw)
    return StationResult(**fields)


def _content(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """ResultContent's KeyValuePairs as a dict."""
    return {p["key"]["name"]: p["value"]["value"] for p in pairs}


def _ok(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    assert lines[0] == {"connected": True}, lines
    return lines[1:]


def _names(browse: dict[str, Any]) -> set[str]:
    """Browse names without their namespace index."""
    return {name.split(":", 1)[-1] for name in browse["names"]}


def _ext(data_type: str, **value: Any) -> dict[str, Any]:
    return {"type": "ext", "dataType": data_type, "value": value}


NULL = {"type": "null"}
CAUSE = [{"type": "Int32", "value": 0}, {"type": "String", "value": "test"}]


def test_a_vision_system_per_station_with_its_state_machine(
    server: VisionServer, pki: Path
) -> None:
    _set_state(server, "st1", "Ready")
    steps = [
        {"op": "browse", "path": ["own:st1"]},
        {"op": "browse", "path": ["own:st1", *VSM]},
        {"op": "browse", "path": ["own:st1", *AUTO]},
        {"op": "read", "path": ["own:st1", *VSM, "ua:CurrentState"]},
        {"op": "read", "path": ["own:st1", *AUTO, "ua:CurrentState"]},
        {"op": "read", "path": ["own:st1", "mv:SystemState"]},
        {"op": "browse", "path": ["own:st2"]},
    ]
    system, vsm, auto, state, auto_state, e10, st2 = _ok(run_client(_plan(server, pki, steps)))
    assert {"VisionStateMachine", "SystemState", "RecipeManagement", "ResultManagement"} <= (
        _names(system)
    )
    assert {"CurrentState", "Halt", "Reset", "AutomaticModeStateMachine"} <= _names(vsm)
    assert {"StartSingleJob", "StartContinuous", "Stop", "Abort", "CurrentState"} <= _names(auto)
    assert state["value"]["text"] == "Operational"
    assert auto_state["value"]["text"] == "Ready"
    assert e10["value"]["state"] == 2  # SEMI E10 standby
    assert st2["status"] == "Good"
    assert "VisionStateMachine" in _names(st2)


def test_state_changes_are_seen(server: VisionServer, pki: Path) -> None:
    read = [
        {"op": "read", "path": ["own:st2", *VSM, "ua:CurrentState"]},
        {"op": "read", "path": ["own:st2", *AUTO, "ua:CurrentState"]},
        {"op": "read", "path": ["own:st2", "mv:SystemState"]},
    ]
    states = ("SingleExecution", "Error", "Halted")

    def change(n: int) -> None:
        _set_state(server, "st2", states[n])

    steps = [{"op": "sync"}, *read] * len(states)
    lines = _ok(run_client(_plan(server, pki, steps), on_ready=change))
    seen = [
        (top["value"]["text"], auto["value"].get("text"), e10["value"]["state"])
        for top, auto, e10 in zip(lines[0::3], lines[1::3], lines[2::3], strict=True)
    ]
    assert seen == [
        ("Operational", "SingleExecution", 1),  # SEMI E10 productive
        ("Error", None, 5),  # unscheduled down
        ("Halted", None, 6),  # non-scheduled
    ]
    with pytest.raises(ValueError, match="no state"):
        server.set_state("st2", "Dancing")


def test_one_result_ready_event_per_result(server: VisionServer, pki: Path) -> None:
    results = [
        _result("st1", 101),
        _result("st1", 102, outcome="reject", outcome_code=2, label="scratch"),
        _result(
            "st1",
            103,
            status="deadline_missed",
            outcome="review",
            outcome_code=3,
            decision_id="",
            model_name="",
            model_version="",
            score=0.0,
            label="",
        ),
        _result("st1", 104, part_id="SENTINEL"),
    ]
    before = server.stats()["results_published"]

    def publish(n: int) -> None:
        for result in results:
            server.on_result(result)
        _wait_stat(server, "results_published", before + len(results))

    latest = ["own:st1", "mv:ResultManagement", "mv:Results", "own:LatestResult"]
    steps = [
        {"op": "events", "path": ["own:st1"], "count": len(results), "seconds": 20},
        {"op": "read", "path": latest},
    ]
    answer, value = _ok(run_client(_plan(server, pki, steps), on_ready=publish))
    events = answer["events"]
    # one event each, in order (a duplicate would come before the sentinel)
    assert [e["PartId"]["id"] for e in events] == ["PART-101", "PART-102", "PART-103", "SENTINEL"]
    assert [e["ResultId"]["id"] for e in events] == [
        "dec-st1-101",
        "dec-st1-102",
        "st1/103",  # a fail-safe result has no decision: station/seq
        "dec-st1-104",
    ]
    assert [_content(e["ResultContent"])["Outcome"] for e in events] == [
        "pass",
        "reject",
        "review",
        "pass",
    ]
    assert [_content(e["ResultContent"])["OutcomeCode"] for e in events] == [1, 2, 3, 1]
    assert [e["ResultState"] for e in events] == [1, 1, 3, 1]  # Completed, Aborted
    first = events[0]
    assert first["SourceName"] == "st1"
    assert first["IsPartial"] is False
    assert first["JobId"]["id"] == "st1/trigger/101"
    assert first["InternalRecipeId"] == {"id": "sorter", "version": "1.0.0"}
    assert _content(first["ResultContent"])["DecisionId"] == "dec-st1-101"
    assert _content(first["ResultContent"])["ModelVersion"] == "1.0.0"
    assert first["CreationTime"].startswith(time.strftime("%Y-", time.gmtime(results[0].wall_time)))
    assert value["value"]["resultId"]["id"] == "dec-st1-104"
    assert value["value"]["partId"]["id"] == "SENTINEL"


def test_anonymous_clients_read_but_never_write_or_call(
    server: VisionServer, pki: Path, fresh: Agent
) -> None:
    _set_state(server, "st1", "Ready")
    steps = [
        {"op": "read", "path": ["own:st1", *VSM, "ua:CurrentState"]},
        {"op": "write", "path": ["own:st1", "own:LastRefusal"], "value": "hello"},
        {"op": "call", "object": ["own:st1", *VSM], "method": ["mv:Halt"], "args": CAUSE},
        {
            "op": "call",
            "object": ["own:st1", *AUTO],
            "method": ["mv:StartSingleJob"],
            "args": [NULL, NULL, NULL, NULL, {"type": "ext-array"}],
        },
    ]
    read, write, halt, job = _ok(run_client(_plan(server, pki, steps)))
    assert read["status"] == "Good"
    assert "BadUserAccessDenied" in write.get("error", write.get("status", ""))
    assert "BadUserAccessDenied" in halt.get("error", halt.get("status", ""))
    assert "BadUserAccessDenied" in job.get("error", job.get("status", ""))
    assert fresh.commands == []
    assert fresh.triggers == []


def test_a_user_cannot_write_either(server: VisionServer, pki: Path) -> None:
    steps = [{"op": "write", "path": ["own:st1", "own:LastRefusal"], "value": "hello"}]
    (write,) = _ok(run_client(_plan(server, pki, steps, **_operator())))
    assert write.get("status", write.get("error", "")).startswith(
        ("BadUserAccessDenied", "BadNotWritable")
    ) or "BadUserAccessDenied" in write.get("error", "")


def test_a_user_starts_a_single_job(server: VisionServer, pki: Path, fresh: Agent) -> None:
    _set_state(server, "st1", "Ready")
    meas = _ext("mv:i=3015", id="M-77")
    latest = ["own:st1", "mv:ResultManagement", "mv:Results", "own:LatestResult"]
    steps = [
        {
            "op": "call",
            "object": ["own:st1", *AUTO],
            "method": ["mv:StartSingleJob"],
            "args": [meas, NULL, NULL, NULL, {"type": "ext-array"}],
        },
        {"op": "sync"},
        {"op": "read", "path": latest},
    ]
    before = server.stats()["results_published"]

    def answer(n: int) -> None:  # the station answers the job
        assert fresh.triggers == ["st1"]  # exactly once
        server.on_result(_result("st1", 201))
        _wait_stat(server, "results_published", before + 1)

    call, value = _ok(run_client(_plan(server, pki, steps, **_operator()), on_ready=answer))
    assert call["status"] == "Good", call
    job_id, error = call["outputs"]
    assert error == 0
    assert fresh.triggers == ["st1"]
    # the station's result carries the job's id and MeasId
    assert value["value"]["jobId"]["id"] == job_id["id"]
    assert value["value"]["measId"]["id"] == "M-77"


def test_the_clear_text_user_signs_in_too_and_a_wrong_password_is_refused(
    server: VisionServer, pki: Path
) -> None:
    failed = server.stats()["logins_failed"]
    read = [{"op": "read", "path": ["own:st1", *VSM, "ua:CurrentState"]}]
    plain = run_client(_plan(server, pki, read, user="plain", password=PLAIN_PASSWORD))
    assert plain[0] == {"connected": True}
    wrong = run_client(_plan(server, pki, read, user="operator", password=WRONG_PASSWORD))
    assert "error" in wrong[0]
    assert "BadUserAccessDenied" in wrong[0]["error"] or "BadIdentityToken" in wrong[0]["error"]
    assert server.stats()["logins_failed"] == failed + 1


def test_methods_answer_bad_invalid_state_outside_their_states(
    server: VisionServer, pki: Path, fresh: Agent
) -> None:
    _set_state(server, "st1", "Halted")
    steps = [
        {
            "op": "call",
            "object": ["own:st1", *AUTO],
            "method": ["mv:StartSingleJob"],
            "args": [NULL, NULL, NULL, NULL, {"type": "ext-array"}],
        },
        {"op": "read", "path": ["own:st1", "own:LastRefusal"]},
        {"op": "call", "object": ["own:st1", *VSM], "method": ["mv:Reset"], "args": CAUSE},
    ]
    job, refusal, reset = _ok(run_client(_plan(server, pki, steps, **_operator())))
    assert job["status"] == "BadInvalidState"
    assert refusal["value"].startswith(
        "StartSingleJob: StartSingleJob is not allowed in state Halted"
    )
    assert fresh.triggers == []
    assert reset["status"] == "Good"
    assert reset["outputs"] == [0]
    assert fresh.commands == [("st1", "reset")]


def test_prepare_recipe_selects_only_what_the_agent_accepts(
    server: VisionServer, pki: Path, fresh: Agent
) -> None:
    _set_state(server, "st2", "Ready")

    def prepare(recipe_id: str) -> dict[str, Any]:
        return {
            "op": "call",
            "object": ["own:st2", *RECIPES],
            "method": ["mv:PrepareRecipe"],
            "args": [NULL, _ext("mv:i=3013", id=recipe_id)],
        }

    prepared = ["own:st2", *RECIPES, "mv:Recipes", "own:b-2", "mv:IsPrepared"]
    steps = [
        prepare("b-2"),
        {"op": "read", "path": prepared},
        prepare("c-3"),
        {"op": "read", "path": ["own:st2", "own:LastRefusal"]},
        prepare("no-such\nbundle"),
        {"op": "read", "path": ["own:st2", "own:LastRefusal"]},
        {
            "op": "call",
            "object": ["own:st2", *RECIPES],
            "method": ["mv:PrepareRecipe"],
            "args": [_ext("mv:i=3002", id="sorter"), NULL],  # two versions: ambiguous
        },
    ]
    ok, is_prepared, refused, why, unknown, unknown_why, ambiguous = _ok(
        run_client(_plan(server, pki, steps, **_operator()))
    )
    assert ok["status"] == "Good", ok
    internal_id, completed, error = ok["outputs"]
    assert internal_id["id"] == "b-2"
    assert internal_id["version"] == "2.0.0"
    assert completed is True
    assert error == 0
    assert is_prepared["value"] is True
    assert refused["status"] == "BadRequestNotAllowed"
    assert "signature" in why["value"]
    assert unknown["status"] == "BadNotFound"
    # the client's id is quoted on one line: its line break escaped
    assert "'no-such\\nbundle'" in unknown_why["value"]
    assert "\n" not in unknown_why["value"]
    assert ambiguous["status"] == "BadNotFound"
    # the agent was asked for the two installed ones only
    assert fresh.selected == [("st2", "b-2"), ("st2", "c-3")]


def test_get_recipe_list_filtered_lists_the_installed_bundles(
    server: VisionServer, pki: Path, fresh: Agent
) -> None:
    def listing(is_prepared: int) -> dict[str, Any]:
        return {
            "op": "call",
            "object": ["own:st1", *RECIPES],
            "method": ["mv:GetRecipeListFiltered"],
            "args": [
                NULL,
                NULL,
                {"type": "Int32", "value": is_prepared},
                {"type": "UInt32", "value": 0},
                {"type": "UInt32", "value": 0},
                {"type": "Int32", "value": 1000},
            ],
        }

    every, prepared = _ok(run_client(_plan(server, pki, [listing(2), listing(1)], **_operator())))
    assert every["status"] == "Good", every
    complete, count, _handle, recipes, error = every["outputs"]
    assert (complete, count, error) == (True, 3, 0)
    assert [r["id"] for r in recipes] == ["a-1", "b-2", "c-3"]
    assert recipes[0]["hash"] == "a1" * 32
    assert recipes[0]["hashAlgorithm"] == "SHA-256"
    assert [r["id"] for r in prepared["outputs"][3]] == ["a-1"]


def test_sign_endpoint_works_and_no_session_without_security(
    server: VisionServer, pki: Path
) -> None:
    read = [{"op": "read", "path": ["own:st1", *VSM, "ua:CurrentState"]}]
    (value,) = _ok(run_client(_plan(server, pki, read, security="Sign", **_operator())))
    assert value["status"] == "Good"

    # A client that opens a channel without security (asyncua accepts one for discovery
    # whatever the endpoints, and checks no permission on it) and asks for a session
    # there, anonymous or with the right password: refused at activation.
    before = server.stats()["sessions_refused_insecure"]
    assert "BadUserAccessDenied" in asyncio.run(_insecure_session(server.endpoint, None))
    assert "BadUserAccessDenied" in asyncio.run(_insecure_session(server.endpoint, PASSWORD))
    assert server.stats()["sessions_refused_insecure"] == before + 2


async def _insecure_session(endpoint: str, password: str | None) -> str:
    """Activate a session over a channel without security, by hand (asyncua's client
    itself would refuse: the server offers no such endpoint). This is an attack on a
    gap of asyncua's server, so asyncua's client is the tool, not an interop peer."""
    from asyncua import Client, ua

    client = Client(endpoint, timeout=10)
    await client.connect_socket()
    try:
        await client.send_hello()
        await client.open_secure_channel()
        params = ua.CreateSessionParameters()
        params.ClientNonce = os.urandom(32)
        params.ClientDescription = ua.ApplicationDescription()
        params.EndpointUrl = endpoint
        params.SessionName = "insecure"
        params.RequestedSessionTimeout = 10_000
        await client.uaclient.create_session(params)
        activate = ua.ActivateSessionParameters()
        if password is None:
            activate.UserIdentityToken = ua.AnonymousIdentityToken(PolicyId="anonymous")
        else:
            activate.UserIdentityToken = ua.UserNameIdentityToken(
                PolicyId="username", UserName="operator", Password=password.encode()
            )
        try:
            await client.uaclient.activate_session(activate)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "activated"
    finally:
        client.disconnect_socket()


def test_results_are_found_by_id_and_by_filter(server: VisionServer, pki: Path) -> None:
    before = server.stats()["results_published"]
    for seq, part in ((301, "FIND-A"), (302, "FIND-B"), (303, "FIND-A")):
        server.on_result(_result("st2", seq, part_id=part))
    _wait_stat(server, "results_published", before + 3)
    management = ["own:st2", "mv:ResultManagement"]
    timeout = {"type": "Int32", "value": 1000}
    by_filter: list[dict[str, Any]] = [
        {"type": "Int32", "value": 0},  # any ResultState
        NULL,
        _ext("mv:i=3004", id="FIND-A"),  # PartId
        *[NULL] * 6,
        {"type": "UInt32", "value": 0},
        {"type": "UInt32", "value": 0},
        timeout,
    ]
    steps = [
        {
            "op": "call",
            "object": management,
            "method": ["mv:GetResultById"],
            "args": [_ext("mv:i=3021", id="dec-st2-302"), timeout],
        },
        {
            "op": "call",
            "object": management,
            "method": ["mv:GetResultComponentsById"],
            "args": [_ext("mv:i=3021", id="dec-st2-301"), timeout],
        },
        {
            "op": "call",
            "object": management,
            "method": ["mv:GetResultListFiltered"],
            "args": by_filter,
        },
        {
            "op": "call",
            "object": management,
            "method": ["mv:GetResultById"],
            "args": [_ext("mv:i=3021", id="no-such-result"), timeout],
        },
        {"op": "call", "object": management, "method": ["mv:GetResultById"], "args": [timeout]},
    ]
    by_id, components, listed, missing, short = _ok(
        run_client(_plan(server, pki, steps, **_operator()))
    )
    assert by_id["status"] == "Good", by_id
    _handle, result, error = by_id["outputs"]
    assert (result["resultId"]["id"], result["partId"]["id"], error) == ("dec-st2-302", "FIND-B", 0)
    assert components["status"] == "Good", components
    assert components["outputs"][6]["id"] == "FIND-A"  # PartId
    assert components["outputs"][12]["id"] == "st2/trigger/301"  # JobId
    assert components["outputs"][-1] == 0
    assert listed["status"] == "Good", listed
    complete, count, _handle, results, error = listed["outputs"]
    assert (complete, count, error) == (True, 2, 0)
    assert [r["resultId"]["id"] for r in results] == ["dec-st2-303", "dec-st2-301"]  # newest first
    assert missing["status"] == "BadNotFound"
    assert short["status"] == "BadArgumentsMissing"


def test_a_recipe_object_prepares_itself_and_unprepare_is_refused(
    server: VisionServer, pki: Path, fresh: Agent
) -> None:
    _set_state(server, "st1", "Ready")
    recipes = ["own:st1", *RECIPES, "mv:Recipes"]
    steps = [
        {"op": "call", "object": [*recipes, "own:b-2"], "method": ["mv:Prepare"], "args": []},
        {"op": "call", "object": [*recipes, "own:b-2"], "method": ["mv:Unprepare"], "args": []},
        {"op": "call", "object": [*recipes, "own:a-1"], "method": ["mv:Unprepare"], "args": []},
    ]
    prepare, unprepare, not_prepared = _ok(run_client(_plan(server, pki, steps, **_operator())))
    assert prepare["status"] == "Good", prepare
    assert prepare["outputs"] == [True, 0]
    assert fresh.selected == [("st1", "b-2")]
    assert unprepare["status"] == "BadNotSupported"  # the station always has one prepared
    assert not_prepared["status"] == "BadInvalidState"


def test_a_slow_agent_answers_bad_timeout_and_unsupported_methods_say_so(
    server: VisionServer, pki: Path, fresh: Agent
) -> None:
    _set_state(server, "st2", "Ready")
    fresh.slow_s = 2.0  # callback_timeout_s is 1 s
    job = {
        "op": "call",
        "object": ["own:st2", *AUTO],
        "method": ["mv:StartSingleJob"],
        "args": [NULL, NULL, NULL, NULL, {"type": "ext-array"}],
    }
    continuous = {**job, "method": ["mv:StartContinuous"]}
    stop = {"op": "call", "object": ["own:st2", *AUTO], "method": ["mv:Stop"], "args": CAUSE}
    wrong_type = {
        "op": "call",
        "object": ["own:st2", *AUTO],
        "method": ["mv:StartSingleJob"],
        "args": [_ext("mv:i=3004", id="a part id where a MeasId goes"), NULL, NULL, NULL, NULL],
    }
    timeouts = server.stats()["callback_timeouts"]
    slow, cont, stopped, mistyped = _ok(
        run_client(_plan(server, pki, [job, continuous, stop, wrong_type], **_operator()))
    )
    assert slow["status"] == "BadTimeout"
    assert server.stats()["callback_timeouts"] == timeouts + 1
    assert cont["status"] == "BadNotSupported"
    assert stopped["status"] == "BadInvalidState"  # nothing is executing
    assert mistyped["status"] == "BadTypeMismatch"


def test_a_missing_node_set_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="the OPC 40100 node set is missing: run make models"):
        opcua_model.check_nodeset(tmp_path / "Opc.Ua.MachineVision.NodeSet2.xml")


def test_a_port_in_use_is_refused_with_the_reason(server: VisionServer) -> None:
    config = server.config.model_copy(update={"results_kept": 1})
    other = VisionServer(
        config,
        ["st9"],
        on_trigger=lambda s, p: True,
        recipes=lambda s: [],
        select_recipe=lambda s, r: None,
    )
    with pytest.raises(LineError) as caught:
        other.start(timeout_s=60.0)
    assert caught.value.reason == "refused"
    assert f"can't listen on 127.0.0.1:{config.port}" in caught.value.detail
    other.stop()  # a second stop does nothing


def test_a_key_that_is_not_the_certificates_is_refused(
    server: VisionServer, tmp_path: Path
) -> None:
    _cert, other_key = make_server_identity(tmp_path, APP_URI)
    config = server.config.model_copy(update={"private_key": other_key})
    other = VisionServer(
        config,
        ["st9"],
        on_trigger=lambda s, p: True,
        recipes=lambda s: [],
        select_recipe=lambda s, r: None,
    )
    with pytest.raises(ConfigError, match="is not the certificate's key"):
        other.start()


def test_results_beyond_the_queue_bound_are_dropped_and_counted() -> None:
    config = OpcUaServerConfig(
        enabled=True, security="none", allow_anonymous_read=True, queue_bound=2
    )
    srv = VisionServer(
        config,
        ["st1"],
        on_trigger=lambda s, p: True,
        recipes=lambda s: [],
        select_recipe=lambda s, r: None,
    )
    for seq in range(5):
        srv.on_result(_result("st1", seq))
    assert srv.stats()["queue_full"] == 3
    assert srv.stats()["queued"] == 2


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"security": "sign"}, "needs `certificate` and `private_key`"),
        ({"security": "none", "users_env": "X"}, "users need a secure channel"),
        ({"security": "none"}, "nobody could connect"),
    ],
)
def test_configs_where_nobody_could_connect_safely_are_refused(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        OpcUaServerConfig(enabled=True, **fields)
