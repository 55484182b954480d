"""The OPC UA server's rules without a server: OPC 40100 states and which method each
allows, recipes selected by id or name, results filtered and paged, and the users file
and password checks (argon2, clear, throttled)."""

from __future__ import annotations

import argon2
import pytest

from agent.line.results import StationResult
from agent.line.servers import vision
from agent.line.servers.opcua_users import (
    FAILURE_BUDGET,
    FAILURE_WINDOW_S,
    MAX_PASSWORD,
    PasswordCheck,
    UsersFileError,
    parse_users,
)
from agent.line.servers.vision import KeptResult, Recipe, ResultQuery

FAST = argon2.PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)


def _result(seq: int, **kw: object) -> StationResult:
    fields: dict[str, object] = {
        "station": "st1",
        "seq": seq,
        "trigger_seq": seq,
        "status": "ok",
        "outcome": "pass",
        "outcome_code": 1,
        "score": 0.9,
        "label": "good",
        "part_id": f"P{seq}",
        "decision_id": f"d{seq}",
        "model_name": "sorter",
        "model_version": "1",
        "trigger_to_result_ms": 5.0,
        "wall_time": 1_700_000_000.0 + seq,
    }
    fields.update(kw)
    return StationResult(**fields)  # type: ignore[arg-type]


def test_every_state_splits_into_the_machine_and_its_automatic_mode() -> None:
    assert vision.split_state("Ready") == ("Operational", "Ready")
    assert vision.split_state("Halted") == ("Halted", None)
    assert set(vision.SEMI_E10) == set(vision.STATES)
    with pytest.raises(ValueError, match="unknown OPC 40100 state"):
        vision.split_state("Operational")  # a composite state: the agent names its sub-state


@pytest.mark.parametrize(
    ("method", "state", "allowed"),
    [
        ("StartSingleJob", "Ready", True),
        ("StartSingleJob", "SingleExecution", False),
        ("StartSingleJob", "Initialized", False),
        ("Halt", "Halted", False),
        ("Halt", "SingleExecution", True),
        ("Reset", "Error", True),
        ("Reset", "SingleExecution", False),
        ("Stop", "Ready", False),
        ("Stop", "ContinuousExecution", True),
        ("PrepareRecipe", "SingleExecution", False),
        ("PrepareRecipe", "Ready", True),
        ("GetResultById", "Error", True),  # not bound to a state
    ],
)
def test_methods_are_allowed_only_in_their_states(method: str, state: str, allowed: bool) -> None:
    why = vision.state_refusal(method, state)
    assert (why is None) is allowed
    if why:
        assert method in why
        assert state in why


def test_a_recipe_is_found_by_internal_id_first_then_by_a_unique_name() -> None:
    recipes = [
        Recipe("a-1", "sorter", "1", "", active=True),
        Recipe("b-2", "sorter", "2", "", active=False),
        Recipe("c-3", "reader", "1", "", active=False),
    ]
    assert vision.find_recipe(recipes, "b-2", "reader")[0] == recipes[1]  # internal wins
    assert vision.find_recipe(recipes, "", "reader")[0] == recipes[2]
    found, why = vision.find_recipe(recipes, "", "sorter")
    assert found is None
    assert "2 recipes are named 'sorter'" in why
    assert vision.find_recipe(recipes, "zz", "")[1] == "no installed recipe has the id 'zz'"
    assert vision.find_recipe(recipes, "", "")[1] == "give the recipe's InternalId or ExternalId"
    prepared = vision.filter_recipes(recipes, "", vision.TRI_TRUE)
    assert [r.id for r in prepared] == ["a-1"]
    assert [r.id for r in vision.filter_recipes(recipes, "sorter", vision.TRI_FALSE)] == ["b-2"]
    assert len(vision.filter_recipes(recipes, "", vision.TRI_DONTCARE)) == 3


def test_a_bundle_digest_becomes_the_recipe_hash() -> None:
    assert vision.digest_bytes("sha256:" + "ab" * 32) == (bytes.fromhex("ab" * 32), "SHA-256")
    assert vision.digest_bytes("cd" * 32) == (bytes.fromhex("cd" * 32), "SHA-256")
    assert vision.digest_bytes("blake3:xyz") == (b"blake3:xyz", "")


def test_results_are_filtered_and_paged() -> None:
    kept = [
        KeptResult(_result(1), "st1/trigger/1"),
        KeptResult(_result(2, status="deadline_missed", decision_id=""), "st1/job/1", "M1"),
        KeptResult(_result(3, part_id="X"), "st1/trigger/3"),
    ]
    assert kept[1].result_id == "st1/2"
    assert kept[1].result_state == vision.RESULT_ABORTED
    assert [k for k in kept if vision.matches(k, ResultQuery(part_id="X"))] == [kept[2]]
    assert [k for k in kept if vision.matches(k, ResultQuery(meas_id="M1"))] == [kept[1]]
    aborted = ResultQuery(result_state=vision.RESULT_ABORTED)
    assert [k for k in kept if vision.matches(k, aborted)] == [kept[1]]
    assert all(vision.matches(k, ResultQuery()) for k in kept)
    assert vision.page(kept, 0, 2) == (kept[:2], False)
    assert vision.page(kept, 2, 2) == (kept[2:], True)
    assert vision.page(kept, 0, 0) == (kept, True)
    assert vision.page(kept, 9, 1) == ([], True)


def test_the_users_file_is_read_strictly() -> None:
    users = parse_users("# comment\n\nop:" + FAST.hash("pw-one") + "\nplain:pw two\n")
    assert users["op"].hashed
    assert not users["plain"].hashed
    assert users["plain"].secret == "pw two"  # noqa: S105
    for text, message in [
        ("", "no user"),
        ("no-colon\n", "line 1: not `name:argon2-hash`"),
        ("a:x\na:y\n", "line 2: user 'a' is given twice"),
        ("bad name:x\n", "line 1: user name"),
        ("a:\n", "line 1"),
    ]:
        with pytest.raises(UsersFileError, match=message):
            parse_users(text)


def test_passwords_are_checked_and_failures_throttled() -> None:
    now = [1000.0]
    users = f"op:{FAST.hash('right one')}\nplain:clear one\nlate:late one\n"
    check = PasswordCheck(parse_users(users), clock=lambda: now[0])
    assert check.check("op", "right one")
    assert check.check("op", "right one")  # recognised without argon2 the second time
    assert check.check("plain", "clear one")
    assert not check.check("op", "wrong")
    assert not check.check("nobody", "x")
    assert not check.check("op", "r" * (MAX_PASSWORD + 1))
    assert check.counters.failed == 3
    for _ in range(FAILURE_BUDGET - 3):
        assert not check.check("op", "wrong")
    assert not check.check("late", "late one")  # over budget: refused unchecked
    assert check.counters.throttled == 1
    assert check.check("op", "right one")  # a user already recognised still signs in
    now[0] += FAILURE_WINDOW_S + 1
    assert check.check("late", "late one")
