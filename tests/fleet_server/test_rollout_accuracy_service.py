"""The accuracy gates through the rollout service over the real fleet database: review
labels saved as the API saves them (decisions stored through the ingest sink) are read
per tick, on the rollout's lines only, for the target version and the version the
devices ran before; a new version the labels show worse stops and reverts the rollout."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from agent.wire.messages import DecisionRow
from fleet_server.db import store
from fleet_server.repository import KeyStore, Repository
from fleet_server.review import save_review
from tests.fleet_server.review_data import T0, Fleet, decision, store_rows
from tests.fleet_server.test_rollout_service import Setup, db, fleet  # noqa: F401


def _labels(
    engine: Engine, device_id: str, *, line: str, version: str, right: int, wrong: int
) -> None:
    """``right`` confirmed and ``wrong`` overridden decisions of cls ``version``."""
    rows: list[DecisionRow] = []
    for i in range(right + wrong):
        row = decision(device_id, T0 + i, line=line, outcome="pass", model_version=version)
        rows.append(row.model_copy(update={"model_name": "cls"}))
    store_rows(engine, Fleet(), rows)
    for i, row in enumerate(rows):
        verdict, outcome = ("confirm", None) if i < right else ("override", "reject")
        save_review(engine, row.id, verdict=verdict, outcome=outcome, note="", reviewer="lena")


def test_labels_that_show_the_new_version_worse_stop_and_revert_the_rollout(
    db: Engine,  # noqa: F811
    fleet: tuple[KeyStore, Repository],  # noqa: F811
) -> None:
    s = Setup(db, fleet)
    for d in ("gw-1", "gw-2"):
        s.device(d)
    s.device("gw-9", line="4")  # another line: its labels do not count
    _labels(db, "gw-1", line="3", version="1.0.0", right=29, wrong=1)
    _labels(db, "gw-1", line="3", version="2.0.0", right=10, wrong=20)
    _labels(db, "gw-9", line="4", version="2.0.0", right=500, wrong=0)
    gates = {"min_accuracy": 0.9, "min_labels": 20, "accuracy_drop": 0.05}
    spec = {"bundle": "cls@2.0.0", "selector": "line=3", "waves": "1,100%", "soak_s": "1h",
            "policy": {"gates": gates}}  # fmt: skip
    rid = s.service.create(spec)
    assert s.tick() == []  # the labels fail the gate before anything is assigned
    view = s.service.get(rid)
    assert view["phase"] == "rolled_back", view["reason"]
    assert view["counts"] == {"pending": 2}
    (note,) = [
        n.payload["message"]
        for n in store.list_events(db, rid, kind="rollout")
        if n.payload["kind"] == "gate_failed"
    ]
    gate = view["gate"]
    assert (gate["accuracy_labels"], gate["accuracy_base_labels"]) == (30, 30)
    assert gate["accuracy"] == round(10 / 30, 4)
    assert gate["accuracy_upper"] < 0.9
    assert gate["accuracy_drop"] == round(29 / 30 - 10 / 30, 4)
    assert gate["accuracy_p_value"] < 0.05
    assert "labelled accuracy 0.333 over 30 labels" in note
    assert "dropped by 0.633" in note


def test_a_rollout_without_accuracy_gates_reads_no_labels(
    db: Engine,  # noqa: F811
    fleet: tuple[KeyStore, Repository],  # noqa: F811
) -> None:
    s = Setup(db, fleet)
    s.device("gw-1")
    _labels(db, "gw-1", line="3", version="2.0.0", right=0, wrong=30)
    rid = s.service.create({"bundle": "cls@2.0.0", "selector": "line=3", "waves": "100%",
                            "soak_s": 0})  # fmt: skip
    s.tick()
    s.install("gw-1", 2)
    s.tick()
    view = s.service.get(rid)
    assert view["phase"] == "completed", view["reason"]
    assert not [k for k in view["gate"] if k.startswith("accuracy")]
