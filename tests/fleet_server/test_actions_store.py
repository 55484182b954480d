"""The fleet's record of remote actions on SQLite and PostgreSQL: counters per device,
never reused; answers folded in order (a final one stays); older unseen requests
superseded; chunks once each and only from their device; a download checked against
what the device said; retention by the tables' own budgets."""

from __future__ import annotations

import base64
import hashlib
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from agent.wire.actions import ActionChunk, ActionResult
from fleet_server.actions import store
from fleet_server.db.tables import action_chunks, device_actions
from fleet_server.retention.config import RetentionSection
from fleet_server.retention.prune import prune

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db (SQLite and PostgreSQL)

T0 = 1_790_000_000.0


def _create(db: Engine, device: str = "cam-1", now: float = T0) -> store.ActionRecord:
    record, signed = store.create(
        db, device_id=device, action="logs", params={"lines": 5}, requested_by="olga",
        expires_at=now + 3600, sign=lambda n, rid: f"{rid}:{n}".encode(), now=now,
    )  # fmt: skip
    assert signed == f"{record.request_id}:{record.counter}".encode()
    return record


def _answer(record: store.ActionRecord, status: str, **extra: object) -> ActionResult:
    return ActionResult(device_id=record.device_id, request_id=record.request_id,
                        status=status, action="logs", counter=record.counter, ts=T0,
                        reason=f"{status} reason", **extra)  # type: ignore[arg-type]  # fmt: skip


def test_each_device_counts_its_own_requests_and_a_failed_signature_uses_none(db: Engine) -> None:
    assert [_create(db).counter for _ in range(3)] == [1, 2, 3]
    assert _create(db, "cam-2").counter == 1

    def broken(_n: int, _rid: str) -> bytes:
        raise RuntimeError("no director key")

    with pytest.raises(RuntimeError, match="no director key"):
        store.create(db, device_id="cam-1", action="logs", params={}, requested_by="olga",
                     expires_at=T0 + 60, sign=broken)  # fmt: skip
    assert _create(db).counter == 4  # the failed one's counter was rolled back with it
    with db.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(device_actions)).scalar() == 5


def test_answers_are_folded_in_order_and_a_final_one_stays(db: Engine) -> None:
    r = _create(db)
    assert store.store_answer(db, "cam-1", _answer(r, "running")) == "stored"
    assert store.store_answer(db, "cam-1", _answer(r, "accepted")) == "stale"  # late, behind
    assert store.get(db, r.request_id).status == "running"  # type: ignore[union-attr]
    done = _answer(r, "ok", chunks=2, bytes=10, sha256="ab" * 32)
    assert store.store_answer(db, "cam-1", done) == "stored"
    assert store.store_answer(db, "cam-1", _answer(r, "failed")) == "stale"
    held = store.get(db, r.request_id)
    assert held is not None
    assert (held.status, held.reason, held.chunks, held.bytes) == ("ok", "ok reason", 2, 10)
    assert store.store_answer(db, "cam-2", _answer(r, "ok")) == "unknown"  # not its request


def test_a_device_answering_a_newer_request_supersedes_the_older_it_never_saw(db: Engine) -> None:
    old, seen, new = _create(db), _create(db), _create(db)
    store.store_answer(db, "cam-1", _answer(seen, "accepted"))
    store.store_answer(db, "cam-1", _answer(new, "ok"))
    assert store.get(db, old.request_id).status == "superseded"  # type: ignore[union-attr]
    assert store.get(db, seen.request_id).status == "accepted"  # type: ignore[union-attr]
    store.store_answer(db, "cam-1", _answer(old, "refused"))  # its own answer still wins
    assert store.get(db, old.request_id).status == "refused"  # type: ignore[union-attr]


def test_a_pending_request_past_its_expiry_is_expired() -> None:
    record = store.ActionRecord("act-1", "cam-1", 1, "logs", {}, "olga", T0, T0 + 60,
                                "pending", "", {}, None, 0, 0, "")  # fmt: skip
    assert store.state(record, T0 + 59) == "pending"
    assert store.state(record, T0 + 60) == "expired"


def test_chunks_are_stored_once_from_their_device_and_a_download_is_checked(db: Engine) -> None:
    r = _create(db)
    blobs = [b"\x1f\x8b first", b"second \x00 part"]
    for seq, blob in enumerate(blobs):
        text = base64.b64encode(blob).decode()
        chunk = ActionChunk(device_id="cam-1", request_id=r.request_id, seq=seq,
                            encoding="base64", data=text, ts=T0)  # fmt: skip
        assert store.store_chunk(db, "cam-1", chunk)
        assert store.store_chunk(db, "cam-1", chunk)  # again: stored once
        assert not store.store_chunk(db, "cam-2", chunk)  # another device's request
    data = b"".join(blobs)
    assert store.received(db, r.request_id) == store.Received(2, len(data), 1)
    assert store.read_chunks(db, r.request_id, after=0) == [(1, blobs[1])]
    sha = hashlib.sha256(data).hexdigest()
    store.store_answer(db, "cam-1", _answer(r, "ok", chunks=2, bytes=len(data), sha256=sha))
    held = store.get(db, r.request_id)
    assert held is not None
    assert store.read_all(db, held) == data
    with db.begin() as conn:
        conn.execute(action_chunks.delete().where(action_chunks.c.seq == 1))
    assert store.read_all(db, held) is None  # a chunk missing: no archive
    late = ActionChunk(device_id="cam-1", request_id=r.request_id, seq=2, encoding="utf-8",
                       data="more after the end", ts=T0)  # fmt: skip
    assert not store.store_chunk(db, "cam-1", late)  # past the count its final answer gave
    far = ActionChunk(device_id="cam-1", request_id=_create(db).request_id,
                      seq=store.MAX_CHUNKS, encoding="utf-8", data="x", ts=T0)  # fmt: skip
    assert not store.store_chunk(db, "cam-1", far)
    bad = ActionChunk(device_id="cam-1", request_id=r.request_id, seq=9, encoding="base64",
                      data="!!not base64", ts=T0)  # fmt: skip
    with pytest.raises(ValueError, match="not base64"):
        store.store_chunk(db, "cam-1", bad)


def test_retention_prunes_chunks_after_7_days_and_requests_after_30(db: Engine) -> None:
    now = time.time()
    old = _create(db, now=now - 40 * 86400)
    recent = _create(db, now=now - 10 * 86400)
    for r, received in ((old, now - 40 * 86400), (recent, now - 10 * 86400)):
        chunk = ActionChunk(device_id="cam-1", request_id=r.request_id, seq=0,
                            encoding="utf-8", data="a line\n", ts=received)  # fmt: skip
        store.store_chunk(db, "cam-1", chunk, now=received)
    fresh = _create(db, now=now)
    store.store_chunk(db, "cam-1", ActionChunk(device_id="cam-1", request_id=fresh.request_id,
                      seq=0, encoding="utf-8", data="x\n", ts=now), now=now)  # fmt: skip
    prune(db, RetentionSection(), now=now)
    assert store.get(db, old.request_id) is None
    assert store.get(db, recent.request_id) is not None  # 10 days: kept, its chunks not
    assert store.received(db, recent.request_id).chunks == 0
    assert store.received(db, fresh.request_id).chunks == 1
