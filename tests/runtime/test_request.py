"""Requests and reservations against an in-memory SlotPool: no worker, no pool.

A request knows its pool only through :class:`runtime.request.SlotPool`; these tests
hold it to that by giving it a recording stand-in with one model's real slot views.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from runtime._internal.shm import Segment, SlotLayout, SlotViews
from runtime.errors import InputShapeError, InputTooLarge, PoolClosed, RequestTimeout
from runtime.request import Request, Reservation, SlotPool
from runtime.scheduler import Priority

REQUEST_PY = Path(__file__).resolve().parents[2] / "runtime" / "request.py"


class RecordingPool:
    """A SlotPool that records every call a request makes of it."""

    def __init__(self, views: SlotViews) -> None:
        self._views = views
        self.calls: list[tuple[str, int]] = []

    def model_name(self, model: int) -> str:
        return f"model-{model}"

    def views(self, model: int) -> SlotViews:
        assert model == 0
        return self._views

    def enqueue(self, request: Request) -> None:
        self.calls.append(("enqueue", request.slot))

    def cancel(self, request: Request) -> None:
        self.calls.append(("cancel", request.slot))

    def release(self, request: Request) -> None:
        self.calls.append(("release", request.slot))

    def abandon(self, request: Request) -> None:
        self.calls.append(("abandon", request.slot))


@pytest.fixture
def pool() -> Iterator[RecordingPool]:
    layout = SlotLayout.build(2, 64, [((1, 4), "<f4")], [((1, 3), "<f4")])
    segment = Segment.create("test-request", layout.total_bytes)
    views = SlotViews(segment, layout)
    yield RecordingPool(views)
    del views
    segment.close()


def reservation(pool: SlotPool, slot: int = 1) -> Reservation:
    return Reservation(pool, Request(pool, 0, slot, Priority.CONTROL, 0, None, None))


def test_request_module_imports_no_pool_module() -> None:
    tree = ast.parse(REQUEST_PY.read_text(encoding="utf-8"))
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    }
    assert not imported & {"runtime.pool", "runtime.dispatch", "runtime.supervisor"}


def test_inputs_are_the_slots_views_in_shared_memory(pool: RecordingPool) -> None:
    res = reservation(pool, slot=1)
    res.inputs[0][:] = 7.0
    assert np.all(pool.views(0).inputs[1][0] == 7.0)
    assert np.all(pool.views(0).inputs[0][0] == 0.0)


def test_leaving_a_reservation_unsubmitted_gives_its_place_back_once(
    pool: RecordingPool,
) -> None:
    with reservation(pool) as res:
        pass
    res.cancel()
    assert pool.calls == [("cancel", 1)]


def test_a_submitted_reservation_is_enqueued_and_never_cancelled(pool: RecordingPool) -> None:
    with reservation(pool) as res:
        res.submit()
    assert pool.calls == [("enqueue", 1)]


def test_a_frame_too_big_for_the_slot_is_refused_naming_the_model(pool: RecordingPool) -> None:
    res = reservation(pool)
    with pytest.raises(InputTooLarge, match="model-0"):
        res.frame(8, 8, 3)
    with pytest.raises(InputShapeError, match="model-0"):
        res.frame(0, 4, 3)
    frame = res.frame(4, 4, 3)
    assert frame.shape == (4, 4, 3)
    assert res.submit().frame_shape == (4, 4, 3)


def test_release_frees_the_slot_exactly_once(pool: RecordingPool) -> None:
    req = reservation(pool).submit()
    req.finish(None)
    with req:
        assert req.outputs[0].shape == (1, 3)
    req.release()
    assert pool.calls == [("enqueue", 1), ("release", 1)]
    with pytest.raises(RuntimeError, match="only readable"):
        _ = req.outputs


def test_a_request_failed_by_the_pool_releases_nothing_itself(pool: RecordingPool) -> None:
    req = reservation(pool).submit()
    req.mark_released()
    req.finish(PoolClosed())
    with pytest.raises(PoolClosed):
        req.wait(0)
    req.release()
    assert pool.calls == [("enqueue", 1)]


def test_a_wait_that_times_out_abandons_the_request(pool: RecordingPool) -> None:
    req = reservation(pool).submit()
    with pytest.raises(RequestTimeout, match="model-0"):
        req.wait(0.01)
    assert pool.calls == [("enqueue", 1), ("abandon", 1)]


def test_finish_calls_the_callback_once_with_the_request(pool: RecordingPool) -> None:
    seen: list[Request] = []
    req = Request(pool, 0, 0, Priority.CONTROL, 0, None, seen.append)
    req.finish(None)
    assert seen == [req]
    assert req.wait(0) is req
