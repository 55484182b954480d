"""The capture tests' shared fixture: the cameras a test started, each stopped after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.capture import Camera


@pytest.fixture
def cameras() -> Iterator[list[Camera]]:
    """Append each started camera here; every one is stopped (10 s at most) after the test."""
    started: list[Camera] = []
    yield started
    for camera in started:
        camera.stop(timeout_s=10.0)
