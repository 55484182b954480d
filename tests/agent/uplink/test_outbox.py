"""The outbox on its own: durable FIFO, the drop policy and its alarm, a SIGKILLed
writer, a real EFBIG disk-full, a damaged file moved aside."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agent import cli
from agent.uplink.outbox import ALARM_DROPPING, ROW_OVERHEAD_BYTES, Outbox, OutboxError

DRIVER = Path(__file__).with_name("outbox_driver.py")
RECORD = 1000 + ROW_OVERHEAD_BYTES


def payload(i: int) -> bytes:
    return f"{i:04d}".encode() + b"p" * 996


def test_records_come_back_oldest_first_after_a_reopen_and_leave_only_when_deleted(
    tmp_path: Path,
) -> None:
    path = tmp_path / "outbox.db"
    with Outbox(path, 10 * RECORD) as box:
        seqs = [box.put("health", "t/h", payload(0)), box.put("event", "t/e", payload(1)),
                box.put("decisions", "t/d", payload(2), ["a", "b"])]  # fmt: skip
    with Outbox(path, 10 * RECORD) as box:
        entries = box.oldest()
        assert [e.seq for e in entries] == seqs
        assert [e.kind for e in entries] == ["health", "event", "decisions"]
        assert entries[2].ids == ("a", "b")
        assert box.decision_ids() == {"a", "b"}
        assert box.bytes == 3 * RECORD
        assert box.delete([seqs[0], seqs[2], 999]) == 2
        assert [e.seq for e in box.oldest()] == [seqs[1]]
        assert [e.seq for e in box.oldest(after=seqs[1])] == []
        assert box.pending() == 1
        assert box.pending("event") == 1


def test_over_budget_it_drops_health_first_then_events_and_decisions_last(
    tmp_path: Path,
) -> None:
    alarms: list[tuple[str, str]] = []
    dropped: list[str] = []
    box = Outbox(
        tmp_path / "o.db", 4 * RECORD,
        on_alarm=lambda k, m: alarms.append((k, m)),
        on_dropped=lambda e: dropped.append(f"{e.kind}{e.payload[:4].decode()}"),
    ).open()  # fmt: skip
    box.put("decisions", "t", payload(0), ["d0"])
    box.put("event", "t", payload(1))
    box.put("health", "t", payload(2))
    box.put("health", "t", payload(3))
    assert alarms == []
    box.put("decisions", "t", payload(4), ["d4"])  # evicts the oldest health
    box.put("event", "t", payload(5))  # evicts the other health
    box.put("decisions", "t", payload(6), ["d6"])  # evicts the oldest event
    box.put("decisions", "t", payload(7), ["d7"])  # evicts the other event
    assert dropped == ["health0002", "health0003", "event0001", "event0005"]
    assert [e.kind for e in box.oldest()] == ["decisions"] * 4
    assert box.put("health", "t", payload(8)) is None  # a health report evicts no decision
    assert box.put("event", "t", payload(9)) is None
    box.put("decisions", "t", payload(10), ["d10"])  # only now the oldest decision goes
    assert dropped[-1] == "decisions0000"
    assert box.stats()["dropped"] == {
        "thumbnail": 0, "quality": 0, "health": 3, "event": 3, "decisions": 1,
    }  # fmt: skip
    assert len(alarms) == 1  # raised once when dropping started
    assert alarms[0][0] == ALARM_DROPPING
    assert "health" in alarms[0][1]
    assert box.stats()["dropping"] is True
    box.delete(e.seq for e in box.oldest()[:3])  # under half the budget: alarm cleared
    assert box.stats()["dropping"] is False
    box.close()


def test_thumbnails_go_first_and_an_order_written_without_them_still_drops_them_first(
    tmp_path: Path,
) -> None:
    dropped: list[str] = []
    box = Outbox(
        tmp_path / "o.db", 3 * RECORD, drop_order=["event", "health", "decisions"],
        on_dropped=lambda e: dropped.append(e.kind),
    ).open()  # fmt: skip
    assert box.drop_order == ("thumbnail", "quality", "event", "health", "decisions")
    box.put("health", "t", payload(0))
    box.put("thumbnail", "t", payload(1), ["d1"])
    box.put("event", "t", payload(2))
    box.put("decisions", "t", payload(3), ["d3"])  # the thumbnail goes, not the older health
    assert dropped == ["thumbnail"]
    assert box.put("thumbnail", "t", payload(4), ["d4"]) is None  # evicts nothing else
    assert box.stats()["dropped"]["thumbnail"] == 2
    box.close()
    with pytest.raises(OutboxError, match="thumbnail, quality, health, event, decisions"):
        Outbox(tmp_path / "p.db", RECORD, drop_order=["health", "event"])
    with pytest.raises(OutboxError, match="unknown record kind 'image'"):
        Outbox(tmp_path / "q.db", RECORD).open().put("image", "t", b"x")


def test_a_record_larger_than_the_whole_budget_is_dropped_and_counted(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db", 2 * RECORD) as box:
        box.put("health", "t", payload(0))
        assert box.put("decisions", "t", b"x" * (3 * RECORD), ["big"]) is None
        assert box.stats()["dropped"]["decisions"] == 1
        assert box.pending() == 1  # nothing else was evicted for it


def test_a_drop_order_that_is_not_an_order_of_the_kinds_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OutboxError, match="drop order"):
        Outbox(tmp_path / "o.db", RECORD, drop_order=["health", "health", "decisions"])
    with Outbox(tmp_path / "o.db", RECORD) as box, pytest.raises(OutboxError, match="kind"):
        box.put("heartbeat", "t", b"{}")


def test_a_writer_killed_mid_stream_loses_no_committed_record(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), str(path), "100000"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    committed: list[int] = []
    for line in proc.stdout:
        committed.append(int(line.split()[1]))
        if len(committed) >= 300:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with Outbox(path, 1 << 30) as box:
        seqs = {e.seq for e in box.oldest(limit=1_000_000)}
        assert set(committed) <= seqs  # every record it said was stored is there
        assert box.pending() == len(seqs)


def test_a_full_disk_drops_by_policy_and_counts_instead_of_failing(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    query = "SELECT kind || ' ' || count(*) || ' ' || max(seq) FROM outbox GROUP BY kind"
    script = (  # a 256 KiB tmpfs in a mount namespace of its own: a really full disk
        f"mount -t tmpfs -o size=256k tmpfs {disk} && "
        f"{sys.executable} {DRIVER} {disk}/o.db 400 && "
        f"sqlite3 {disk}/o.db 'PRAGMA integrity_check' \"{query}\""
    )
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    puts = [int(line.split()[1]) for line in lines if line.startswith("put")]
    done = next(line for line in lines if line.startswith("done"))
    assert len(puts) + lines.count("dropped") == 400  # every record: stored or counted
    assert 30 <= len(puts) < 400  # records went in until the disk was full
    assert "health': 134" in done  # every health report went first
    assert "outbox_dropping" in result.stderr  # the alarm was raised
    assert "the disk is full" in result.stderr
    integrity, kinds = lines[-2], lines[-1]
    assert integrity == "ok"
    kind, count, newest = kinds.split()
    assert kind == "decisions"  # only decisions are left: they go last
    assert int(count) >= 10
    assert int(newest) == max(puts)  # the newest decision was kept, the oldest went


def test_a_damaged_outbox_is_moved_aside_and_a_new_one_started(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)
    with Outbox(path, RECORD * 4) as box:
        assert box.pending() == 0
        assert box.put("event", "t", b"{}") is not None
    assert list(tmp_path.glob("o.db.corrupt-*"))


def test_edge_agent_outbox_shows_what_waits_by_kind_and_decisions_by_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "agent.toml").write_text('[agent]\ndevice_id = "dev-q"\nstate_dir = "st"\n')
    with Outbox(tmp_path / "st" / "outbox.db", 100 * RECORD) as box:
        box.put("health", "t", payload(0))
        box.put("health", "t", payload(1))
        box.put("decisions", "t", payload(2), ["a"])
    assert cli.main(["outbox", "--config", str(tmp_path / "agent.toml"), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["records"]["health"]["count"] == 2
    assert status["records"]["decisions"]["bytes"] == 1000
    assert status["decisions"] == {}  # no decision log yet
    assert cli.main(["outbox", "--config", str(tmp_path / "agent.toml")]) == 0
    assert "health" in capsys.readouterr().out
