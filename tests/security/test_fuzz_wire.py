"""Property-based fuzzing of the parsers of device bytes: the untrusted-JSON entry point,
every wire message (gzip uploads too), fetch requests and sensor payloads.

Property: a valid result or the parser's documented error (with a message); never
another exception, never a ``RecursionError``. Inputs: deep nesting, lone surrogates,
huge and non-finite numbers, long strings, wrong types, random bytes, and valid messages
with fields mutated.
"""

from __future__ import annotations

import base64
import tracemalloc
from typing import Any

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.decisionlog.record import new_id
from agent.kernel.errors import BundleError
from agent.sensors.parse import MAX_PAYLOAD_BYTES as SENSOR_MAX
from agent.sensors.parse import BadReading, parse_csv_row, parse_payload
from agent.wire import compress, untrusted
from agent.wire.fetch import (
    MAX_REQUEST_BYTES,
    FetchProtocolError,
    FetchRequest,
    decode_request,
    encode_request,
    request_id_of,
)
from agent.wire.manifest import parse_manifest
from agent.wire.messages import (
    MAX_PAYLOAD_BYTES,
    BundleRef,
    DecisionRow,
    DecisionUpload,
    Event,
    Health,
    Heartbeat,
    Message,
    MessageError,
    Percentiles,
    ReportedState,
    Telemetry,
    ThumbnailUpload,
    parse,
    parse_telemetry,
)
from tests.security.fuzz_support import (
    MAX_MESSAGE,
    TEXT,
    dumps,
    holds,
    hostile_payloads,
    json_values,
)

TS = 1_750_000_000.25


def _row() -> DecisionRow:
    return DecisionRow(
        id=new_id(TS),
        capture_time=TS - 0.02,
        decision_time=TS,
        device_id="dev-1",
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
    )


def _jpeg() -> bytes:
    ok, buf = cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))
    assert ok
    return bytes(buf)


VALID: list[Message] = [
    ReportedState(
        device_id="dev-1",
        ts=TS,
        agent_version="0.1.0",
        profile="x86-gateway",
        labels={"line": "3"},
        active=BundleRef(name="cls", version="2.0.0", release=2),
    ),
    Heartbeat(device_id="dev-1", seq=7, ts=TS),
    Health(
        device_id="dev-1",
        seq=7,
        ts=TS,
        fps={"cam1": 29.5},
        latency_ms={"cls": Percentiles(p50=3.1, p95=4.0, p99=6.2, count=1800)},
        queue_depth={"cls": 2},
        cpu_percent=35.0,
        temperature_c={"cpu": 51.0},
    ),
    Telemetry(device_id="dev-1", seq=1, ts=TS, metrics={"belt_speed": 1.2}),
    DecisionUpload(device_id="dev-1", rows=[_row(), _row()]),
    ThumbnailUpload.of("dev-1", "0197-a", TS, _jpeg()),
    Event(device_id="dev-1", kind="alarm", event_id="ev-1", ts=TS, payload={"why": "hot"}),
]


def _valid(model: type[Message]) -> dict[str, Any]:
    (message,) = (m for m in VALID if type(m) is model)
    return message.model_dump(mode="json")


# -- the untrusted JSON entry point ------------------------------------------------------


@settings(max_examples=800)
@given(st.one_of(hostile_payloads({"a": [1, {"b": "c"}]}), json_values.map(dumps)))
def test_untrusted_loads_returns_checked_json_or_refuses_it(data: bytes) -> None:
    value = holds(
        lambda: untrusted.loads(data, what="fuzz", max_bytes=64 * 1024),
        untrusted.UntrustedInputError,
    )
    if value is not None:
        untrusted.check_value(value, "again")  # what it returns holds its own rules


@settings(max_examples=300)
@given(json_values, st.integers(1, 40))
def test_check_value_refuses_or_accepts_any_python_value(value: Any, depth: int) -> None:
    holds(lambda: untrusted.check_value(value, "fuzz", depth), untrusted.UntrustedInputError)


@settings(max_examples=200)
@given(st.text(st.characters(codec=None, exclude_categories=()), max_size=300))
def test_untrusted_loads_takes_any_python_text(text: str) -> None:
    holds(lambda: untrusted.loads(text, what="fuzz", max_bytes=4096), untrusted.UntrustedInputError)


# -- wire messages -----------------------------------------------------------------------


MODELS = [type(m) for m in VALID]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@settings(max_examples=150)
@given(data=st.data())
def test_every_message_model_parses_or_names_what_is_wrong(
    model: type[Message], data: st.DataObject
) -> None:
    payload = data.draw(hostile_payloads(_valid(model)))
    message = holds(lambda: parse(model, payload), MessageError)
    if message is not None:
        assert isinstance(message, model)


@settings(max_examples=200)
@given(st.one_of(hostile_payloads(_valid(Health)), hostile_payloads(_valid(Telemetry))))
def test_the_telemetry_topic_parses_or_names_what_is_wrong(payload: bytes) -> None:
    message = holds(lambda: parse_telemetry(payload), MessageError)
    if message is not None:
        assert isinstance(message, Health | Telemetry)


@settings(max_examples=200)
@given(
    st.one_of(
        hostile_payloads(_valid(DecisionUpload)).map(compress.compress),
        st.binary(max_size=256).map(lambda b: compress.compress(b"")[:10] + b),
        st.binary(max_size=64).map(compress.compress),
        st.integers(1, 3 * MAX_PAYLOAD_BYTES).map(lambda n: compress.compress(b" " * n)),
    )
)
def test_gzip_decision_uploads_inflate_within_bounds_or_are_refused(payload: bytes) -> None:
    message = holds(lambda: parse(DecisionUpload, payload), MessageError)
    if message is not None:
        assert len(message.rows) >= 1


# -- fetch requests ----------------------------------------------------------------------

VALID_REQUEST = FetchRequest(id="a1b2", path="metadata/1.root.json", offset=0, max=4096)


@settings(max_examples=500)
@given(
    st.one_of(
        hostile_payloads(VALID_REQUEST.model_dump(mode="json"), max_depth=5000),
        st.just(encode_request(VALID_REQUEST)),
    )
)
def test_fetch_requests_decode_or_are_a_protocol_error(payload: bytes) -> None:
    request = holds(lambda: decode_request(payload), FetchProtocolError)
    request_id = request_id_of(payload)  # never raises
    assert request_id is None or isinstance(request_id, str)
    if request is not None:
        assert request_id == request.id
        assert len(payload) <= MAX_REQUEST_BYTES


# -- sensor payloads ---------------------------------------------------------------------


@settings(max_examples=500)
@given(
    st.one_of(
        hostile_payloads({"t": 21.5, "p": 1013}),
        st.floats(allow_nan=True, allow_infinity=True).map(lambda f: repr(f).encode()),
        st.text(st.characters(codec=None, exclude_categories=()), max_size=80),
    ),
    st.sampled_from([["t"], ["t", "p"], ["x"]]),
)
def test_sensor_payloads_are_readings_or_bad_readings(
    payload: bytes | str, fields: list[str]
) -> None:
    reading = holds(lambda: parse_payload(payload, fields, "s1"), BadReading)
    if reading is not None:
        assert reading.shape == (len(fields),)
        assert np.isfinite(reading).all()


@settings(max_examples=300)
@given(st.lists(TEXT, max_size=5), st.integers(0, 5))
def test_sensor_csv_rows_are_readings_or_bad_readings(row: list[str], width: int) -> None:
    columns = [0, 2][: min(2, width)] if width > 2 else [0][: min(1, width)]
    fields = [f"f{c}" for c in columns]
    reading = holds(lambda: parse_csv_row(row, columns, width, fields, "s1"), BadReading)
    if reading is not None:
        assert np.isfinite(reading).all()


# -- memory: the biggest inputs each parser takes ----------------------------------------

DEEP_MAX = b"[" * (MAX_PAYLOAD_BYTES // 2) + b"]" * (MAX_PAYLOAD_BYTES // 2)
WIDE_MAX = b"[" + b"0," * (MAX_PAYLOAD_BYTES // 2 - 1) + b"0]"
BOMB = compress.compress(b" " * (64 * MAX_PAYLOAD_BYTES))
LONG_TEXT = b'{"device_id": "' + b"x" * (MAX_PAYLOAD_BYTES - 40) + b'"}'


@pytest.mark.parametrize(
    ("name", "call", "error"),
    [
        ("deep message", lambda: parse(Heartbeat, DEEP_MAX), MessageError),
        ("wide message", lambda: parse(DecisionUpload, WIDE_MAX), MessageError),
        ("gzip bomb", lambda: parse(DecisionUpload, BOMB), MessageError),
        ("long string", lambda: parse(Event, LONG_TEXT), MessageError),
        ("deep fetch", lambda: decode_request(b"[" * MAX_REQUEST_BYTES), FetchProtocolError),
        (
            "deep sensor",
            lambda: parse_payload(b"[" * SENSOR_MAX, ["t"], "s"),
            BadReading,
        ),
        (
            "thumbnail of noise",
            lambda: parse(
                ThumbnailUpload,
                dumps(
                    {
                        **_valid(ThumbnailUpload),
                        "data": base64.b64encode(b"\xff\xd8" + b"\x00" * 190_000).decode(),
                    }
                ),
            ),
            MessageError,
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_the_biggest_hostile_inputs_stay_within_a_memory_bound(
    name: str, call: Any, error: type[Exception]
) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(error):
            call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * MAX_PAYLOAD_BYTES, f"{name}: {peak} bytes at peak"


# -- refusals stay short: an error does not repeat or multiply what was sent -------------

LONG = "x" * 400_000


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (
            lambda: parse(DecisionUpload, dumps({"device_id": "d", "rows": [{}] * 1000})),
            MessageError,
        ),
        (lambda: parse(Heartbeat, dumps({"device_id": LONG, "seq": 1, "ts": 1.0})), MessageError),
        (lambda: parse(Event, dumps({**_valid(Event), "kind": LONG})), MessageError),
        (lambda: parse_manifest(dumps({"outputs": [{"name": 1}] * 3000}), "m"), BundleError),
        (
            lambda: parse_manifest(dumps({"models": {"onnx": {"file": "m", "sha256": LONG}}}), "m"),
            BundleError,
        ),
        (lambda: decode_request(dumps({"id": "a", "path": "p" * 4000})), FetchProtocolError),
        (lambda: parse_payload(LONG[:60_000], ["t"], "s"), BadReading),
    ],
)
def test_a_refusal_of_a_big_input_is_a_short_message(call: Any, error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        call()
    assert len(str(info.value)) <= MAX_MESSAGE
