"""CameraConfig: what a camera section accepts and how a bad one is named."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent.capture import CameraConfig


def _error_fields(exc: ValidationError) -> list[str]:
    return [".".join(str(p) for p in e["loc"]) for e in exc.errors()]


def test_synthetic_camera_needs_no_uri_and_has_documented_defaults() -> None:
    c = CameraConfig(name="cam1", kind="synthetic")
    assert (c.uri, c.fps, c.loop, c.width, c.height, c.pattern) == (
        "",
        10.0,
        True,
        640,
        480,
        "bars",
    )
    assert (c.stall_timeout_s, c.backoff_initial_s, c.backoff_max_s) == (5.0, 0.5, 30.0)
    for name, field in CameraConfig.model_fields.items():
        assert field.description, f"{name} has no description"


@pytest.mark.parametrize("kind", ["v4l2", "rtsp", "http", "file", "images"])
def test_uri_is_required_for_every_kind_but_synthetic(kind: str) -> None:
    with pytest.raises(ValidationError) as info:
        CameraConfig(name="cam1", kind=kind)
    assert _error_fields(info.value) == ["uri"]
    assert "uri is required" in str(info.value)


@pytest.mark.parametrize(
    ("kind", "uri"),
    [("rtsp", "http://cam/stream"), ("http", "rtsp://cam/stream"), ("http", "cam:8080/x")],
)
def test_stream_uri_with_the_wrong_scheme_is_refused_naming_uri(kind: str, uri: str) -> None:
    with pytest.raises(ValidationError) as info:
        CameraConfig(name="cam1", kind=kind, uri=uri)
    assert _error_fields(info.value) == ["uri"]
    assert "must start with" in str(info.value)


def test_stream_uris_with_the_right_scheme_are_accepted() -> None:
    assert CameraConfig(name="a", kind="rtsp", uri="rtsp://10.0.0.5/live").uri.startswith("rtsp")
    assert CameraConfig(name="b", kind="http", uri="https://cam/mjpg").kind == "http"
    assert CameraConfig(name="c", kind="v4l2", uri="0").uri == "0"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"fps": 0}, "fps"),
        ({"fps": -5}, "fps"),
        ({"stall_timeout_s": 0}, "stall_timeout_s"),
        ({"backoff_initial_s": 2.0, "backoff_max_s": 1.0}, "backoff_max_s"),
        ({"pattern": "stripes"}, "pattern"),
        ({"name": "a/b"}, "name"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_values_and_unknown_keys_are_refused_naming_the_field(
    changes: dict[str, object], field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        CameraConfig.model_validate({"name": "cam1", "kind": "synthetic", **changes})
    assert field in _error_fields(info.value)


def test_camera_config_is_immutable() -> None:
    c = CameraConfig(name="cam1", kind="synthetic")
    with pytest.raises(ValidationError):
        c.fps = 30.0  # type: ignore[misc]


def test_backoff_doubles_up_to_its_maximum_and_resets() -> None:
    from agent.capture.backoff import Backoff

    backoff = Backoff(0.5, 3.0)
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.next() == 0.5
    with pytest.raises(ValueError, match="bad backoff"):
        Backoff(2.0, 1.0)


def test_stream_passwords_are_kept_out_of_messages() -> None:
    from agent.capture.sources import redact

    assert redact("rtsp://admin:s3cret@10.0.0.5:554/live") == "rtsp://admin:***@10.0.0.5:554/live"
    assert redact("http://cam.local/mjpg") == "http://cam.local/mjpg"
