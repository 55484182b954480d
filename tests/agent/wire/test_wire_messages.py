"""The device -> fleet messages of the wire contract: round trips that keep unknown
fields, refusals that name the size or the field, and agreement with the decision log."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import cv2
import numpy as np
import pytest

from agent.decisionlog import schema
from agent.decisionlog.encode import row_of
from agent.decisionlog.record import DecisionRecord, new_id
from agent.wire import topics
from agent.wire.jpeg import JpegError, jpeg_size
from agent.wire.messages import (
    MAX_PAYLOAD_BYTES,
    MAX_THUMBNAIL_BYTES,
    BundleRef,
    DecisionRow,
    DecisionUpload,
    Event,
    Health,
    Heartbeat,
    Message,
    MessageError,
    PayloadTooLarge,
    Percentiles,
    ReportedState,
    Telemetry,
    ThumbnailUpload,
    encode,
    install_state_event,
    parse,
    parse_telemetry,
)
from fleet_server.ingest.sink import merge_state

TS = 1_750_000_000.25


def _row(device_id: str = "dev-1", **extra: object) -> DecisionRow:
    return DecisionRow(
        id=new_id(TS),
        capture_time=TS - 0.02,
        decision_time=TS,
        device_id=device_id,
        source="cam1",
        line="3",
        model_name="cls",
        model_version="1.0.0",
        bundle_digest="sha256:ab",
        backend="onnxruntime",
        config_hash="c0ffee",
        input_digest="d1",
        outputs={"top": [{"label": "ok", "score": 0.9}]},
        outcome="pass",
        thresholds={"reject": 0.5},
        latencies_ms={"infer": 3.5, "e2e": 20.0},
        e2e_ms=20.0,
        **extra,  # type: ignore[arg-type]
    )


def _one_of_each() -> list[Message]:
    return [
        ReportedState(
            device_id="dev-1",
            ts=TS,
            agent_version="0.1.0",
            profile="x86-gateway",
            labels={"line": "3"},
            active=BundleRef(name="cls", version="2.0.0", release=2),
            previous=BundleRef(name="cls", version="1.0.0", release=1),
        ),
        Heartbeat(device_id="dev-1", seq=7, ts=TS),
        Health(
            device_id="dev-1",
            seq=7,
            ts=TS,
            fps={"cam1": 29.5},
            latency_ms={"cls": Percentiles(p50=3.1, p95=4.0, p99=6.2, count=1800)},
            queue_depth={"cls": 2},
            drops={"cam1": 1},
            cpu_percent=35.0,
            memory_mb=412.5,
            temperature_c={"cpu": 51.0},
            disk_free_mb=10_000.0,
            disk_used_mb=2_000.0,
        ),
        Telemetry(device_id="dev-1", seq=1, ts=TS, metrics={"belt_speed": 1.2}),
        DecisionUpload(device_id="dev-1", rows=[_row(), _row()]),
        Event(device_id="dev-1", kind="alarm", event_id="ev-1", ts=TS, payload={"why": "hot"}),
    ]


@pytest.mark.parametrize("message", _one_of_each(), ids=lambda m: type(m).__name__)
def test_every_message_kind_survives_encode_and_parse(message: Message) -> None:
    data = encode(message)
    back = parse(type(message), data)
    assert back == message
    assert json.loads(data)["schema_version"] == 1
    assert json.loads(data)["kind"] == message.kind  # type: ignore[attr-defined]


def test_unknown_fields_are_kept_at_every_level_through_round_trips() -> None:
    raw = json.loads(encode(_one_of_each()[0]))
    raw["firmware"] = {"build": 42}
    raw["active"]["signed_by"] = "fleet-2"
    health = json.loads(encode(_one_of_each()[2]))
    health["gpu_percent"] = 80
    health["latency_ms"]["cls"]["p999"] = 9.9
    upload = json.loads(encode(_one_of_each()[4]))
    upload["rows"][0]["roi"] = [1, 2, 3, 4]

    state = parse(ReportedState, json.dumps(raw).encode())
    again = json.loads(encode(parse(ReportedState, encode(state))))
    assert again["firmware"] == {"build": 42}
    assert again["active"]["signed_by"] == "fleet-2"

    h = json.loads(encode(parse(Health, json.dumps(health).encode())))
    assert h["gpu_percent"] == 80
    assert h["latency_ms"]["cls"]["p999"] == 9.9

    u = json.loads(encode(parse(DecisionUpload, json.dumps(upload).encode())))
    assert u["rows"][0]["roi"] == [1, 2, 3, 4]


def test_an_oversized_payload_is_refused_with_its_size() -> None:
    beat = json.loads(encode(Heartbeat(device_id="dev-1", seq=1, ts=TS)))
    beat["padding"] = "x" * MAX_PAYLOAD_BYTES
    data = json.dumps(beat).encode()
    with pytest.raises(PayloadTooLarge) as caught:
        parse(Heartbeat, data)
    assert caught.value.size == len(data)
    assert str(len(data)) in str(caught.value)
    big = Heartbeat(device_id="dev-1", seq=1, ts=TS, padding="y" * 1000)
    with pytest.raises(PayloadTooLarge, match=f"payload of {len(encode(big))} bytes .* 100 bytes"):
        encode(big, max_bytes=100)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b'{"device_id": "dev-1", "seq": 1, "ts": NaN}', "not JSON"),
        (b'{"device_id": "dev-1", "seq": 1, "ts": 1e999}', "out of range"),
        (b"[1, 2]", "a JSON list, not an object"),
        (b'{"device_id": "dev-1", "seq": "seven", "ts": 1.5}', "seq"),
        (b'{"device_id": "dev-1", "seq": 1}', "ts: Field required"),
        (b'{"device_id": "a/#", "seq": 1, "ts": 1.5}', "not a device id"),
        (b'{"device_id": "dev-1", "seq": -1, "ts": 1.5}', "seq"),
        (b'{"device_id": "dev-1", "seq": 1, "ts": 1.5, "kind": "health"}', "kind"),
        (b'{"device_id": "dev-1", "seq": 1, "ts": 1.5, "schema_version": 2}', "schema_version"),
    ],
)
def test_malformed_or_wrongly_typed_payloads_are_refused_naming_why(
    payload: bytes, expected: str
) -> None:
    with pytest.raises(MessageError, match="heartbeat message") as caught:
        parse(Heartbeat, payload)
    assert expected in str(caught.value)


def test_a_decision_upload_with_another_devices_row_is_refused() -> None:
    with pytest.raises(MessageError, match="is of device 'dev-2'"):
        parse(
            DecisionUpload,
            json.dumps(
                {"device_id": "dev-1", "rows": [_row().model_dump(), _row("dev-2").model_dump()]}
            ).encode(),
        )


def test_decision_rows_carry_the_decision_log_columns_but_the_local_upload_flag() -> None:
    assert set(DecisionRow.model_fields) == set(schema.COLUMNS) - {"uploaded"}


def _upload_of(**row: object) -> bytes:
    """An upload of one row as a device would send it: ``row`` replaces or adds fields,
    a ``None`` value leaves the field out."""
    data = _row().model_dump(mode="json")
    for name, value in row.items():
        if value is None:
            data.pop(name, None)
        else:
            data[name] = value
    return json.dumps({"device_id": "dev-1", "rows": [data]}, ensure_ascii=False).encode()


def test_an_older_agents_row_without_the_station_fields_is_accepted_as_free_running() -> None:
    payload = _upload_of(station=None, part_id=None, deadline_missed=None, future_field=[1])
    assert b'"station"' not in payload
    row = parse(DecisionUpload, payload).rows[0]
    assert (row.station, row.part_id, row.deadline_missed) == ("", "", False)
    assert row.model_extra == {"future_field": [1]}  # unknown fields kept, as ever


def test_a_station_rows_fields_round_trip() -> None:
    sent = _upload_of(station="st-2.a_B", part_id="P-0042 Ä/7 #" + "x" * 115, deadline_missed=True)
    row = parse(DecisionUpload, sent).rows[0]
    assert row.station == "st-2.a_B"
    assert row.part_id == "P-0042 Ä/7 #" + "x" * 115  # 128 characters: the limit
    assert row.deadline_missed is True
    assert parse(DecisionUpload, encode(DecisionUpload(device_id="dev-1", rows=[row]))) == (
        parse(DecisionUpload, sent)
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"part_id": "P" * 129}, r"rows\.0\.part_id: .*129 characters \(at most 128\)"),
        ({"part_id": "P-1\n"}, r"rows\.0\.part_id: .*unprintable character U\+000A"),
        ({"part_id": "P-\x1b[31m"}, r"rows\.0\.part_id: .*U\+001B"),
        ({"part_id": "P-\u202e1"}, r"rows\.0\.part_id: .*U\+202E"),  # bidi override
        ({"part_id": "P-\x85"}, r"rows\.0\.part_id: .*U\+0085"),  # C1
        ({"part_id": 42}, r"rows\.0\.part_id: Input should be a valid string"),
        ({"station": "st 1"}, r"rows\.0\.station: .*not a station name"),
        ({"station": "st-1\n"}, r"rows\.0\.station: .*not a station name"),
        ({"station": "-st"}, r"rows\.0\.station: .*not a station name"),
        ({"station": "s" * 65}, r"rows\.0\.station: .*not a station name"),
        ({"deadline_missed": "yes"}, r"rows\.0\.deadline_missed: Input should be a valid boolean"),
        ({"deadline_missed": 1}, r"rows\.0\.deadline_missed: Input should be a valid boolean"),
    ],
)
def test_bad_station_fields_are_refused_naming_the_field(
    fields: dict[str, object], expected: str
) -> None:
    with pytest.raises(MessageError, match=expected):
        parse(DecisionUpload, _upload_of(**fields))


def test_a_part_id_with_nul_or_a_lone_surrogate_is_refused_before_the_model() -> None:
    """The untrusted-input entry point's rules come first: NUL and lone surrogates never
    reach the row's validator."""
    for raw, why in ((b"P\\u0000", "NUL"), (b"P\\ud800", "lone surrogate")):
        payload = _upload_of(part_id="MARK").replace(b"MARK", raw)
        with pytest.raises(MessageError, match=rf"\$\.rows\[0\]\.part_id: .*{why}"):
            parse(DecisionUpload, payload)


def test_a_row_read_from_a_real_decision_log_becomes_an_upload(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "decisions.db")
    conn.row_factory = sqlite3.Row
    schema.migrate(conn)
    record = DecisionRecord(
        capture_time=TS - 0.01,
        decision_time=TS,
        source="cam1",
        line="3",
        model_name="cls",
        model_version="1.0.0",
        bundle_digest="sha256:ab",
        backend="onnxruntime",
        config_hash="c0ffee",
        input_digest="d1",
        outputs={"score": 0.93},
        outcome="reject",
        thresholds={"reject": 0.5},
        latencies_ms={"infer": 2.5},
        id=new_id(TS),
        station="st-1",
        part_id="P-0042",
        deadline_missed=True,
    )
    with conn:
        conn.execute(schema.INSERT_SQL, row_of(record, "dev-1", None))
    row = conn.execute(f"SELECT * FROM {schema.TABLE}").fetchone()  # noqa: S608
    conn.close()

    assert row["deadline_missed"] == 1  # SQLite's boolean
    upload = DecisionUpload(device_id="dev-1", rows=[DecisionRow.from_log_row(dict(row))])
    back = parse(DecisionUpload, encode(upload)).rows[0]
    assert back.id == record.id
    assert (back.station, back.part_id, back.deadline_missed) == ("st-1", "P-0042", True)
    assert back.outputs == {"score": 0.93}
    assert back.e2e_ms == pytest.approx(10.0)
    assert back.key() == ("dev-1", record.id)
    with pytest.raises(MessageError, match="outputs"):
        DecisionRow.from_log_row({**dict(row), "outputs": "{broken"})


def test_the_telemetry_topic_carries_health_and_plain_telemetry() -> None:
    health, telemetry = _one_of_each()[2], _one_of_each()[3]
    assert isinstance(parse_telemetry(encode(health)), Health)
    assert isinstance(parse_telemetry(encode(telemetry)), Telemetry)
    bad = json.loads(encode(health))
    bad["latency_ms"]["cls"]["p99"] = "slow"
    with pytest.raises(MessageError, match=r"health message: latency_ms\.cls\.p99"):
        parse_telemetry(json.dumps(bad).encode())


def test_events_accept_kinds_this_code_does_not_know_but_not_malformed_ones() -> None:
    event = Event(device_id="dev-1", kind="door-opened", event_id="e:1", ts=TS)
    assert parse(Event, encode(event)).kind == "door-opened"
    with pytest.raises(MessageError, match="event kind"):
        parse(Event, encode(event).replace(b"door-opened", b"Door Opened"))
    with pytest.raises(MessageError, match="record id"):
        parse(Event, encode(event).replace(b'"e:1"', b'"e 1"'))


def test_an_install_report_becomes_an_install_event_with_an_id_from_its_content() -> None:
    report = {"outcome": "failed", "step": "verify", "reason": "hash mismatch"}
    first = install_state_event("dev-1", report)
    assert first.kind == "install"
    assert first.payload == report
    assert install_state_event("dev-1", dict(report)).event_id == first.event_id
    assert install_state_event("dev-2", report).event_id != first.event_id
    assert install_state_event("dev-1", {**report, "step": "fetch"}).event_id != first.event_id
    with pytest.raises(MessageError, match="differs from the topic"):
        install_state_event("dev-1", {**report, "device_id": "dev-2"})


def test_the_last_will_changes_only_online_and_older_states_are_ignored() -> None:
    state = _one_of_each()[0]
    assert isinstance(state, ReportedState)
    will = parse(ReportedState, encode(ReportedState.offline("dev-1")))
    offline = merge_state(state, will)
    assert offline is not None
    assert offline.online is False
    assert offline.active == state.active
    assert offline.ts == state.ts
    older = state.model_copy(update={"ts": TS - 10, "agent_version": "0.0.9"})
    assert merge_state(state, older) is None
    newer = state.model_copy(update={"ts": TS + 10, "agent_version": "0.2.0"})
    assert merge_state(offline, newer) == newer


def test_fleet_side_filters_and_shared_subscriptions() -> None:
    assert topics.device_filter(topics.heartbeat) == "edgefleet/devices/+/heartbeat"
    assert topics.device_filter(topics.install_state) == "edgefleet/devices/+/install/state"
    assert (
        topics.shared("ingest", topics.device_filter(topics.events))
        == "$share/ingest/edgefleet/devices/+/events"
    )
    assert topics.filter_of(topics.decisions("dev-9")) == topics.device_filter(topics.decisions)
    for group in ("", "a/b", "g+", "#", "x" * 65):
        with pytest.raises(ValueError, match="shared subscription group"):
            topics.shared(group, "t")
    with pytest.raises(ValueError, match="not a device topic"):
        topics.filter_of("other/devices/x/heartbeat")


def test_sample_record_ids_are_stable_and_differ_between_kinds() -> None:
    beat = Heartbeat(device_id="dev-1", seq=3, ts=TS)
    health = Health(device_id="dev-1", seq=3, ts=TS)
    again = parse(Heartbeat, encode(beat))
    assert again.key() == beat.key() == ("dev-1", beat.record_id)
    assert health.record_id != beat.record_id
    assert Heartbeat(device_id="dev-1", seq=3, ts=TS + 0.001).key() != beat.key()


def _jpeg(width: int, height: int, quality: int = 90, gray: bool = False) -> bytes:
    image = np.zeros((height, width) if gray else (height, width, 3), np.uint8)
    image[::3] = 200
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return bytes(buf)


@pytest.mark.parametrize(("width", "height", "gray"), [(320, 240, False), (17, 301, True)])
def test_the_size_of_a_jpeg_is_read_from_its_frame_header(
    width: int, height: int, gray: bool
) -> None:
    assert jpeg_size(_jpeg(width, height, gray=gray)) == (width, height)
    progressive = cv2.imencode(
        ".jpg", np.full((height, width, 3), 50, np.uint8), [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]
    )[1]
    assert jpeg_size(bytes(progressive)) == (width, height)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x89PNG\r\n\x1a\n", "no FF D8 start-of-image marker"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "segment FF E0 of length 16"),
        (b"\xff\xd8\xff\xda\x00\x08", "no frame header before the image data"),
        (b"\xff\xd8\x00", "no marker at byte 2"),
        (b"\xff\xd8\xff\xc0\x00\x0b\x08\x00\x00\x00\x10\x03\x01\x11\x00", "says 16 x 0"),
    ],
)
def test_a_jpeg_without_a_readable_size_is_refused_naming_why(data: bytes, why: str) -> None:
    with pytest.raises(JpegError, match=why):
        jpeg_size(data)


def test_a_thumbnail_round_trips_and_a_non_jpeg_or_oversized_one_is_refused() -> None:
    picture = _jpeg(64, 48)
    thumb = ThumbnailUpload.of("dev-1", "0197-a", 1_750_000_000.0, picture)
    back = parse(ThumbnailUpload, encode(thumb))
    assert (back.jpeg(), jpeg_size(back.jpeg()), back.key()) == (
        picture,
        (64, 48),
        ("dev-1", "0197-a"),
    )
    with pytest.raises(MessageError, match="no FF D8 start-of-image marker"):
        ThumbnailUpload.of("dev-1", "0197-a", 1_750_000_000.0, b"GIF89a" + b"\0" * 10)
    big = picture[:-2] + b"\0" * (MAX_THUMBNAIL_BYTES - len(picture) + 8) + picture[-2:]
    with pytest.raises(MessageError, match=f"over {MAX_THUMBNAIL_BYTES}|at most"):
        ThumbnailUpload.of("dev-1", "0197-a", 1_750_000_000.0, big)
    with pytest.raises(MessageError, match="decision_id"):
        ThumbnailUpload.of("dev-1", "no/slash", 1_750_000_000.0, picture)
