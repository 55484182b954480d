"""The worker pool with real worker processes, real sessions and real shared memory.

Pools that a test doesn't break are shared per module (a pool starts in ~0.5 s); a
test that kills, stops or closes a pool's workers builds its own. Every wait has a
timeout and every polling loop a bound, so a broken pool fails a test instead of
hanging the suite.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from runtime import (
    BatchConfig,
    DeadlineExceeded,
    InferenceFailed,
    InputDtypeError,
    InputShapeError,
    InputTooLarge,
    ModelConfig,
    ModelLoadError,
    Overloaded,
    PoolClosed,
    PoolConfig,
    PreprocessSpec,
    Priority,
    Request,
    RequestTimeout,
    WorkerCrashed,
    WorkerPool,
)
from runtime._internal.shm import shm_dir
from runtime.backends import available_backends

pytestmark = pytest.mark.timeout(60)

HEARTBEAT_S = 5.0  # generous: only the stuck-worker test relies on heart-beating
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
FRAME_LIMIT = 64 * 64 * 3
WIDE_FRAME_LIMIT = 1 << 18  # room for a frame wider than 65535 pixels


# -- helpers ------------------------------------------------------------------------
def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0, what: str = "") -> None:
    """Poll ``condition`` every 20 ms for at most ``timeout_s``; fail if it never holds."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / 0.02) + 1):
        if condition():
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    pytest.fail(f"not within {timeout_s} s: {what}")


def child_pids() -> set[int]:
    """Live child processes of this process, from /proc (no psutil)."""
    me = os.getpid()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the fields after "(comm)": state, ppid, ...
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == me and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def own_segments() -> set[str]:
    return {p.name for p in shm_dir().glob(f"edgefleet-{os.getpid()}-*")}


def bare_session(path: str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def new_worker(pool: WorkerPool, old_pid: int, index: int = 0) -> int:
    """Wait until worker ``index`` runs again under a pid other than ``old_pid``."""

    def replaced() -> bool:
        pid = pool.worker_pids()[index]
        return pid is not None and pid != old_pid and pool.ready_workers() == pool.config.workers

    wait_for(replaced, 10.0, f"worker {index} (pid {old_pid}) replaced and ready")
    pid = pool.worker_pids()[index]
    assert pid is not None
    return pid


def counts(pool: WorkerPool, model: str) -> dict[str, int]:
    return pool.stats()["models"][model]["counts"]  # type: ignore[no-any-return]


def bgr_frame(b: int, g: int, r: int, height: int = 32, width: int = 48) -> np.ndarray:
    frame = np.empty((height, width, 3), np.uint8)
    frame[:, :] = (b, g, r)
    return frame


# -- pools --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pool(
    add_model: str, image_model: str, batch_model: str, reshape_model: str
) -> Iterator[WorkerPool]:
    """Two workers serving the small generated models."""
    models = [
        ModelConfig("add", add_model),
        ModelConfig(
            "img",
            image_model,
            preprocess=PreprocessSpec(
                color="rgb", layout="nchw", scale=1 / 255, mean=(0, 0, 0), std=(1, 1, 1)
            ),
            max_frame_bytes=FRAME_LIMIT,
        ),
        ModelConfig(
            "img_norm",
            image_model,
            preprocess=PreprocessSpec(
                color="rgb", layout="nchw", scale=1 / 255, mean=IMAGENET_MEAN, std=IMAGENET_STD
            ),
            max_frame_bytes=WIDE_FRAME_LIMIT,
        ),
        ModelConfig("batch", batch_model, batching=BatchConfig(max_batch=4, max_wait_us=20000)),
        ModelConfig("reshape", reshape_model),
    ]
    with WorkerPool(models, PoolConfig(workers=2, heartbeat_timeout_s=HEARTBEAT_S)) as p:
        yield p


@pytest.fixture(scope="module")
def real_pool(real_model: Callable[[str], str]) -> Iterator[WorkerPool]:
    """Two workers serving the pretrained PaddleOCR models at fixed input sizes."""
    models = [
        ModelConfig(
            "cls", real_model("ppocr_mobile_v2_cls.onnx"), input_shapes={"x": (1, 3, 48, 192)}
        ),
        ModelConfig("det", real_model("ppocr_v4_det.onnx"), input_shapes={"x": (1, 3, 64, 64)}),
    ]
    with WorkerPool(models, PoolConfig(workers=2, heartbeat_timeout_s=HEARTBEAT_S)) as p:
        yield p


@pytest.fixture(scope="module")
def slow_pool(slow_model: str) -> Iterator[WorkerPool]:
    """One worker, a model that takes ~40 ms a run, and room for two queued requests.

    Tests using it leave it drained: every request they submit ends before they return.
    """
    models = [ModelConfig("slow", slow_model, queue_bound=2)]
    with WorkerPool(models, PoolConfig(workers=1, heartbeat_timeout_s=HEARTBEAT_S)) as p:
        yield p


@pytest.fixture
def slow_input() -> np.ndarray:
    return np.random.default_rng(7).random((256, 256), dtype=np.float32)


# -- results ------------------------------------------------------------------------
def test_outputs_equal_a_bare_onnxruntime_session(pool: WorkerPool, add_model: str) -> None:
    x = np.array([[0.5, -2.0, 3.25, 1e6]], np.float32)
    out = pool.infer("add", x)
    np.testing.assert_array_equal(out[0], x + 1)
    np.testing.assert_array_equal(out[0], bare_session(add_model).run(None, {"x": x})[0])


def test_concurrent_requests_each_get_their_own_outputs(pool: WorkerPool) -> None:
    xs = [np.full((1, 4), i, np.float32) + np.arange(4, dtype=np.float32) for i in range(8)]
    reqs = [pool.submit("add", x) for x in xs]
    for req, x in zip(reqs, xs, strict=True):
        with req.wait(10):
            np.testing.assert_array_equal(req.outputs[0], x + 1)


@pytest.mark.realmodel
@pytest.mark.parametrize(
    ("model", "file", "shape"),
    [
        ("cls", "ppocr_mobile_v2_cls.onnx", (1, 3, 48, 192)),
        ("det", "ppocr_v4_det.onnx", (1, 3, 64, 64)),
    ],
    ids=["ppocr-cls", "ppocr-det"],
)
def test_real_onnx_model_outputs_match_a_bare_session(
    real_pool: WorkerPool,
    real_model: Callable[[str], str],
    model: str,
    file: str,
    shape: tuple[int, ...],
) -> None:
    x = text_like_image(shape)
    got = real_pool.infer(model, x)
    want = bare_session(real_model(file)).run(None, {"x": x})
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert np.ptp(got[0]) > 0.1  # the input gives the model something to see


def text_like_image(shape: tuple[int, ...]) -> np.ndarray:
    """Dark lines on a light, noisy page, normalised as PaddleOCR expects ([-1, 1])."""
    _, c, h, w = shape
    page = np.random.default_rng(3).uniform(0.95, 1.0, (c, h, w)).astype(np.float32)
    for top in range(h // 4, h - h // 8, h // 4):
        page[:, top : top + max(2, h // 10), w // 8 : w - w // 8] = 0.1
    return ((page - 0.5) / 0.5)[None]


def _require_litert() -> None:
    info = {b.key: b for b in available_backends()}["litert"]
    assert info.available, f"the litert backend is unavailable here: {info.reason}"


@pytest.mark.realmodel
def test_tflite_model_outputs_match_a_bare_litert_interpreter(
    real_model: Callable[[str], str],
) -> None:
    _require_litert()
    from ai_edge_litert.interpreter import Interpreter

    path = real_model("blazepose_detector.tflite")
    bare = Interpreter(model_path=path, num_threads=1)
    bare.allocate_tensors()
    detail = bare.get_input_details()[0]
    x = np.random.default_rng(5).random(tuple(detail["shape"]), dtype=np.float32)
    bare.set_tensor(detail["index"], x)
    bare.invoke()
    want = [bare.get_tensor(d["index"]).copy() for d in bare.get_output_details()]
    config = PoolConfig(workers=1, heartbeat_timeout_s=HEARTBEAT_S)
    with WorkerPool([ModelConfig("pose", path)], config) as pool:
        assert pool.info("pose").backend == "litert"
        got = pool.infer("pose", x)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


# -- pinning ------------------------------------------------------------------------
def test_each_worker_is_pinned_to_its_own_single_core(pool: WorkerPool) -> None:
    pids = pool.worker_pids()
    assert len(pids) == 2
    assert all(pid is not None for pid in pids)
    affinities = [os.sched_getaffinity(pid) for pid in pids if pid is not None]
    assert all(len(cores) == 1 for cores in affinities), affinities
    assert affinities[0] != affinities[1]
    status = Path(f"/proc/{pids[0]}/status").read_text()
    allowed = next(line for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
    assert allowed.split(":")[1].strip() == str(next(iter(affinities[0])))


# -- inputs that don't fit ----------------------------------------------------------
def test_wrong_input_shape_raises_input_shape_error_naming_expected_and_got(
    pool: WorkerPool,
) -> None:
    with pytest.raises(InputShapeError) as exc:
        pool.submit("add", np.zeros((4, 1), np.float32))
    assert exc.value.expected == (1, 4)
    assert exc.value.got == (4, 1)
    assert "(1, 4)" in str(exc.value)
    assert "(4, 1)" in str(exc.value)
    with pytest.raises(InputShapeError, match=r"expected \(1, 4\), got \(1, 3\)"):
        pool.submit("add", np.zeros((1, 3), np.float32))


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.float16])
def test_wrong_input_dtype_raises_input_dtype_error(pool: WorkerPool, dtype: type) -> None:
    with pytest.raises(InputDtypeError) as exc:
        pool.submit("add", np.zeros((1, 4), dtype))
    assert exc.value.expected == "float32"
    assert exc.value.got == np.dtype(dtype).name


def test_oversized_input_is_refused_before_taking_a_slot(pool: WorkerPool) -> None:
    pool.reset_metrics()
    big = np.zeros((1, 5), np.float32)
    # more attempts than the model has slots: a leaked slot or queue place would show
    for _ in range(30):
        with pytest.raises(InputTooLarge) as exc:
            pool.submit("add", big)
        assert exc.value.limit_bytes == 16
        assert exc.value.got_bytes == 20
    assert counts(pool, "add")["submitted"] == 0
    assert counts(pool, "add")["refused"] == 0
    xs = [np.full((1, 4), i, np.float32) for i in range(8)]  # the whole queue's worth
    reqs = [pool.submit("add", x) for x in xs]
    for req, x in zip(reqs, xs, strict=True):
        with req.wait(10):
            np.testing.assert_array_equal(req.outputs[0], x + 1)


def test_oversized_frame_is_refused_with_input_too_large(pool: WorkerPool) -> None:
    pool.reset_metrics()
    for _ in range(30):
        with pytest.raises(InputTooLarge) as exc:
            pool.submit("img", frame=np.zeros((65, 64, 3), np.uint8))
        assert exc.value.limit_bytes == FRAME_LIMIT
        assert exc.value.got_bytes == 65 * 64 * 3
        with pool.reserve("img") as res, pytest.raises(InputTooLarge):
            res.frame(65, 64)
    assert counts(pool, "img")["submitted"] == 0
    out = pool.infer("img", frame=bgr_frame(255, 255, 255, 64, 64))
    np.testing.assert_allclose(out[0], [[1.0, 1.0, 1.0]], atol=1e-6)


@pytest.mark.parametrize(
    "shape",
    [(1, 70_000, 3), (0, 64, 3), (64, 0)],
    ids=["wider-than-65535", "zero-height", "zero-width-grey"],
)
def test_frame_with_a_side_the_worker_protocol_cannot_carry_is_refused(
    pool: WorkerPool, shape: tuple[int, ...]
) -> None:
    pool.reset_metrics()
    with pytest.raises(InputShapeError):
        pool.submit("img_norm", frame=np.zeros(shape, np.uint8))
    with pool.reserve("img_norm") as res, pytest.raises(InputShapeError):
        res.frame(shape[0], shape[1])
    assert counts(pool, "img_norm")["submitted"] == 0
    # both workers still take work: hold two requests in flight at once
    reqs = [pool.submit("img_norm", frame=bgr_frame(0, 0, 0)) for _ in range(4)]
    for req in reqs:
        req.wait(10).release()


def test_frame_of_the_wrong_dtype_raises_input_dtype_error(pool: WorkerPool) -> None:
    with pytest.raises(InputDtypeError):
        pool.submit("img", frame=np.zeros((8, 8, 3), np.float32))


# -- models that can't be loaded --------------------------------------------------------
@contextlib.contextmanager
def no_worker_started() -> Iterator[None]:
    before = child_pids()
    active_before = {p.pid for p in multiprocessing.active_children()}
    yield
    assert child_pids() <= before
    assert {p.pid for p in multiprocessing.active_children()} <= active_before


def test_corrupt_model_file_fails_in_the_constructor_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.onnx"
    path.write_bytes(b"\x08\x07garbage" + np.random.default_rng(11).bytes(4096))
    with no_worker_started(), pytest.raises(ModelLoadError) as exc:
        WorkerPool([ModelConfig("m", str(path))], PoolConfig(workers=1))
    assert exc.value.path == str(path)
    assert str(path) in str(exc.value)


def test_missing_model_file_fails_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.onnx"
    with no_worker_started(), pytest.raises(ModelLoadError) as exc:
        WorkerPool([ModelConfig("m", str(path))])
    assert str(path) in str(exc.value)


def test_text_file_named_onnx_fails_to_load(tmp_path: Path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("this is not a model\n" * 10)
    with no_worker_started(), pytest.raises(ModelLoadError) as exc:
        WorkerPool([ModelConfig("m", str(path))])
    assert str(path) in str(exc.value)


def test_onnx_file_named_tflite_fails_to_load(tmp_path: Path, add_model: str) -> None:
    path = tmp_path / "add.tflite"
    path.write_bytes(Path(add_model).read_bytes())
    with no_worker_started(), pytest.raises(ModelLoadError) as exc:
        WorkerPool([ModelConfig("m", str(path))])
    assert str(path) in str(exc.value)
    assert "TFLite" in exc.value.reason


def test_unsupported_operator_fails_to_load_naming_the_file(custom_op_model: str) -> None:
    with no_worker_started(), pytest.raises(ModelLoadError) as exc:
        WorkerPool([ModelConfig("m", custom_op_model)])
    assert exc.value.path == custom_op_model
    assert custom_op_model in str(exc.value)
    assert "Frobnicate" in exc.value.reason


@pytest.mark.realmodel
def test_tflite_model_with_an_unresolved_custom_op_fails_to_load_naming_the_file(
    real_model: Callable[[str], str],
) -> None:
    _require_litert()
    path = real_model("face_landmark_attention.tflite")
    with no_worker_started(), pytest.raises(ModelLoadError) as exc:
        WorkerPool([ModelConfig("m", path)])
    assert exc.value.path == path
    assert path in str(exc.value)
    assert "Landmarks2TransformMatrix" in exc.value.reason


@pytest.mark.realmodel
def test_dynamic_dimensions_without_input_shapes_fail_naming_the_input(
    real_model: Callable[[str], str],
) -> None:
    path = real_model("ppocr_mobile_v2_cls.onnx")
    with no_worker_started(), pytest.raises(ModelLoadError) as exc:
        WorkerPool([ModelConfig("m", path)])
    assert path in str(exc.value)
    assert "'x'" in exc.value.reason
    assert "dynamic" in exc.value.reason


def test_dynamic_batch_dimension_defaults_to_one(pool: WorkerPool) -> None:
    assert pool.info("batch").inputs[0].concrete_shape() == (1, 4)


# -- admission, deadlines, priorities ------------------------------------------------
def test_full_queue_refuses_at_once_with_overloaded(
    slow_pool: WorkerPool, slow_input: np.ndarray
) -> None:
    slow_pool.reset_metrics()
    running = slow_pool.submit("slow", slow_input)  # goes straight to the idle worker
    queued = [slow_pool.submit("slow", slow_input) for _ in range(2)]  # fills the queue
    t = time.monotonic()
    with pytest.raises(Overloaded) as exc:
        slow_pool.submit("slow", slow_input)
    assert time.monotonic() - t < 0.5, "a full queue must refuse, never block"
    assert exc.value.queue_bound == 2
    with pytest.raises(Overloaded):
        slow_pool.reserve("slow")
    c = counts(slow_pool, "slow")
    assert c["refused"] == 2
    assert c["submitted"] == 3
    for req in [running, *queued]:
        with req.wait(10):
            np.testing.assert_array_equal(req.outputs[0], slow_input)
    # drained: accepted again
    np.testing.assert_array_equal(slow_pool.infer("slow", slow_input)[0], slow_input)
    assert counts(slow_pool, "slow")["completed"] == 4


def test_queued_request_past_its_deadline_is_dropped_without_running(
    slow_pool: WorkerPool, slow_input: np.ndarray, slow_model_run_s: float
) -> None:
    deadline_s = 0.002
    assert slow_model_run_s > 5 * deadline_s  # the premise: one run outlasts the deadline
    slow_pool.reset_metrics()
    running = slow_pool.submit("slow", slow_input)
    late = slow_pool.submit("slow", slow_input, deadline_s=deadline_s)
    with pytest.raises(DeadlineExceeded) as exc:
        late.wait(10)
    assert exc.value.late_by_ms >= 0
    running.wait(10).release()
    # one more request behind it: had the late one run, it would have run before this
    slow_pool.infer("slow", slow_input)
    c = counts(slow_pool, "slow")
    assert c["expired"] == 1
    assert c["completed"] == 2
    assert c["failed"] == 0
    late.release()  # already freed on expiry; releasing again is harmless


@pytest.fixture(scope="module")
def slow_pool_unpipelined(slow_model: str) -> Iterator[WorkerPool]:
    """As ``slow_pool``, with nothing queued ahead at the busy worker."""
    models = [ModelConfig("slow", slow_model, queue_bound=2)]
    config = PoolConfig(workers=1, heartbeat_timeout_s=HEARTBEAT_S, pipelining=False)
    with WorkerPool(models, config) as p:
        yield p


def test_control_request_overtakes_a_queued_background_request(
    slow_pool_unpipelined: WorkerPool, slow_input: np.ndarray
) -> None:
    slow_pool = slow_pool_unpipelined
    order: list[str] = []
    running = slow_pool.submit("slow", slow_input, callback=lambda r: order.append("running"))
    background = slow_pool.submit(
        "slow",
        slow_input,
        priority=Priority.BACKGROUND,
        callback=lambda r: order.append("background"),
    )
    control = slow_pool.submit(
        "slow", slow_input, priority=Priority.CONTROL, callback=lambda r: order.append("control")
    )
    for req in (running, background, control):
        with req.wait(10):
            np.testing.assert_array_equal(req.outputs[0], slow_input)
    assert running.t_complete_ns < control.t_complete_ns < background.t_complete_ns
    wait_for(lambda: len(order) == 3, 5.0, "all three callbacks")
    assert order == ["running", "control", "background"]


def test_pipelining_queues_one_request_ahead_at_a_busy_worker_and_counts_it_in_the_bound(
    slow_pool: WorkerPool, slow_input: np.ndarray
) -> None:
    running = slow_pool.submit("slow", slow_input)
    ahead = slow_pool.submit("slow", slow_input)
    wait_for(lambda: slow_pool.queued("slow") == 0, 5.0, "the second request sent ahead")
    queued = slow_pool.submit("slow", slow_input)
    assert slow_pool.queued("slow") == 1  # only one ahead per worker
    with pytest.raises(Overloaded):  # bound 2: one ahead + one queued
        slow_pool.submit("slow", slow_input)
    for req in (running, ahead, queued):
        with req.wait(10):
            np.testing.assert_array_equal(req.outputs[0], slow_input)
    assert running.t_complete_ns < ahead.t_complete_ns < queued.t_complete_ns
    # the ahead request started as soon as the one before it ended: no round trip
    assert ahead.t_dispatch_ns < running.t_complete_ns


def test_abandoned_request_frees_its_slot_when_it_completes(
    slow_pool: WorkerPool, slow_input: np.ndarray
) -> None:
    abandoned = slow_pool.submit("slow", slow_input)
    with pytest.raises(RequestTimeout):
        abandoned.wait(0.001)
    wait_for(abandoned.done, 10.0, "the abandoned request to finish")
    # The pool has 4 slots (2 queued + 1 running + 1 extra). Hold a result in every one:
    # that only works if the abandoned request gave its slot back.
    held: list[Request] = []
    try:
        held.extend(slow_pool.submit("slow", slow_input).wait(10) for _ in range(4))
    finally:
        for req in held:
            req.release()
    assert len(held) == 4


# -- batching -----------------------------------------------------------------------
def test_batched_requests_each_get_their_own_result(pool: WorkerPool) -> None:
    xs = [np.arange(4, dtype=np.float32)[None, :] + 10 * i for i in range(4)]
    reqs = [pool.submit("batch", x) for x in xs]
    for req, x in zip(reqs, xs, strict=True):
        with req.wait(10):
            np.testing.assert_array_equal(req.outputs[0], x * 2)
    # one batch: dispatched together and answered by one worker response
    assert len({r.t_dispatch_ns for r in reqs}) == 1
    assert len({r.t_complete_ns for r in reqs}) == 1


def test_lone_request_on_a_batching_model_runs_after_max_wait(pool: WorkerPool) -> None:
    x = np.array([[1.0, -1.0, 0.5, 8.0]], np.float32)
    req = pool.submit("batch", x)
    with req.wait(10):
        np.testing.assert_array_equal(req.outputs[0], x * 2)
    assert req.t_dispatch_ns - req.t_submit_ns >= 20_000_000  # it waited for company


# -- preprocessing in the worker ---------------------------------------------------------
def test_worker_turns_a_bgr_frame_into_scaled_rgb_nchw(pool: WorkerPool) -> None:
    out = pool.infer("img", frame=bgr_frame(10, 20, 30))
    np.testing.assert_allclose(out[0], [[30 / 255, 20 / 255, 10 / 255]], rtol=0, atol=1e-6)


def test_worker_preprocessing_normalises_with_mean_and_std(pool: WorkerPool) -> None:
    out = pool.infer("img_norm", frame=bgr_frame(10, 20, 30))
    rgb = np.array([30, 20, 10]) / 255
    want = (rgb - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    np.testing.assert_allclose(out[0], want[None, :], rtol=0, atol=1e-5)


def test_frame_written_into_a_reserved_slot_is_preprocessed(pool: WorkerPool) -> None:
    with pool.reserve("img") as res:
        buf = res.frame(32, 48)
        assert buf.shape == (32, 48, 3)
        assert buf.dtype == np.uint8
        buf[:, :] = (200, 100, 50)
        req = res.submit()
    with req.wait(10):
        np.testing.assert_allclose(
            req.outputs[0], [[50 / 255, 100 / 255, 200 / 255]], rtol=0, atol=1e-6
        )


# -- worker faults -----------------------------------------------------------------------
def test_killed_worker_fails_its_request_and_is_replaced(
    slow_model: str, slow_input: np.ndarray
) -> None:
    config = PoolConfig(workers=1, heartbeat_timeout_s=HEARTBEAT_S)
    with WorkerPool([ModelConfig("slow", slow_model, queue_bound=2)], config) as pool:
        (pid,) = pool.worker_pids()
        assert pid is not None
        req = pool.submit("slow", slow_input)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerCrashed) as exc:
            req.wait(10)
        assert "SIGKILL" in exc.value.detail
        new_pid = new_worker(pool, pid)
        assert not Path(f"/proc/{pid}").exists()
        np.testing.assert_array_equal(pool.infer("slow", slow_input)[0], slow_input)
        assert pool.restarts() == 1
        assert pool.worker_pids() == [new_pid]
        assert counts(pool, "slow")["crashed"] == 1
        assert pool.degraded is None


def test_stuck_worker_is_killed_and_replaced(add_model: str) -> None:
    config = PoolConfig(workers=1, heartbeat_timeout_s=0.5)
    with WorkerPool([ModelConfig("add", add_model)], config) as pool:
        (pid,) = pool.worker_pids()
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            req = pool.submit("add", np.zeros((1, 4), np.float32))
            with pytest.raises(WorkerCrashed, match="heart-beating"):
                req.wait(10)
            new_worker(pool, pid)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        assert not Path(f"/proc/{pid}").exists()
        x = np.ones((1, 4), np.float32)
        np.testing.assert_array_equal(pool.infer("add", x)[0], x + 1)
        assert pool.restarts() == 1


def test_pool_degrades_once_the_restart_budget_is_spent(add_model: str) -> None:
    config = PoolConfig(workers=1, restart_budget=1, heartbeat_timeout_s=HEARTBEAT_S)
    with WorkerPool([ModelConfig("add", add_model)], config) as pool:
        (first,) = pool.worker_pids()
        assert first is not None
        os.kill(first, signal.SIGKILL)
        second = new_worker(pool, first)
        assert pool.degraded is None
        os.kill(second, signal.SIGKILL)
        wait_for(lambda: pool.degraded is not None, 10.0, "the pool to report degraded")
        assert "budget" in (pool.degraded or "")
        assert pool.stats()["degraded"] == pool.degraded
        assert pool.restarts() == 1
        assert pool.worker_pids() == [None]
        t = time.monotonic()
        with pytest.raises(PoolClosed, match="budget"):
            pool.submit("add", np.zeros((1, 4), np.float32))
        assert time.monotonic() - t < 0.5


# -- closing ---------------------------------------------------------------------------
def test_close_fails_queued_and_in_flight_requests_with_pool_closed(
    slow_model: str, slow_input: np.ndarray
) -> None:
    config = PoolConfig(workers=1, heartbeat_timeout_s=HEARTBEAT_S)
    pool = WorkerPool([ModelConfig("slow", slow_model, queue_bound=2)], config).start()
    try:
        in_flight = pool.submit("slow", slow_input)
        queued = [pool.submit("slow", slow_input) for _ in range(2)]
    finally:
        pool.close()
    for req in [in_flight, *queued]:
        with pytest.raises(PoolClosed):
            req.wait(10)


def test_close_is_idempotent_stops_workers_and_removes_shared_memory(add_model: str) -> None:
    before = own_segments()
    pool = WorkerPool([ModelConfig("add", add_model)], PoolConfig(workers=2)).start()
    try:
        pids = pool.worker_pids()
        assert own_segments() - before, "a started pool maps its segments under shm_dir()"
        pool.infer("add", np.zeros((1, 4), np.float32))
    finally:
        pool.close()
    assert own_segments() == before
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists()
    pool.close()  # again: nothing to do, no error
    with pytest.raises(PoolClosed):
        pool.submit("add", np.zeros((1, 4), np.float32))


# -- requests and stats --------------------------------------------------------------------
def test_outputs_are_readable_until_release(pool: WorkerPool) -> None:
    x = np.full((1, 4), 41, np.float32)
    req = pool.submit("add", x)
    with req.wait(10):
        np.testing.assert_array_equal(req.outputs[0], np.full((1, 4), 42, np.float32))
    with pytest.raises(RuntimeError, match="release"):
        _ = req.outputs
    req.release()  # idempotent


def test_backend_error_fails_the_request_with_inference_failed_and_the_worker_lives(
    pool: WorkerPool,
) -> None:
    pool.reset_metrics()
    pids = pool.worker_pids()
    x = np.arange(4, dtype=np.float32)[None, :]
    with pytest.raises(InferenceFailed) as exc:
        pool.infer("reshape", [x, np.array([3, 3], np.int64)])  # 4 values can't be 3x3
    assert exc.value.model == "reshape"
    assert exc.value.detail
    assert counts(pool, "reshape")["failed"] == 1
    # the same workers go on serving, the failed slot was given back
    for _ in range(20):
        out = pool.infer("reshape", [x, np.array([1, 4], np.int64)])
        np.testing.assert_array_equal(out[0], x)
    assert pool.worker_pids() == pids
    assert pool.restarts() == 0


def test_stats_histograms_count_every_completed_request(pool: WorkerPool) -> None:
    pool.reset_metrics()
    n = 7
    for i in range(n):
        pool.infer("add", np.full((1, 4), i, np.float32))
    stats = pool.stats()
    model = stats["models"]["add"]
    assert model["counts"]["submitted"] == n
    assert model["counts"]["completed"] == n
    for stage, summary in model["stages"].items():
        assert summary["count"] == n, stage
        assert summary["p99_ms"] >= summary["p50_ms"], stage
        assert summary["max_ms"] >= summary["p99_ms"], stage
    assert stats["workers"] == 2
    assert stats["ready_workers"] == 2
    assert stats["degraded"] is None


def test_worker_log_records_reach_the_parent_logger(
    add_model: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    config = PoolConfig(
        workers=1,
        heartbeat_timeout_s=HEARTBEAT_S,
        providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
    )
    with WorkerPool([ModelConfig("add", add_model)], config) as pool:
        (pid,) = pool.worker_pids()

        def from_worker() -> list[logging.LogRecord]:
            return [
                r
                for r in caplog.records
                if r.process == pid and "CUDAExecutionProvider" in r.getMessage()
            ]

        wait_for(lambda: bool(from_worker()), 10.0, "the worker's provider warning")
        assert from_worker()[0].levelno == logging.WARNING
        assert from_worker()[0].name == "runtime.backends.onnx"
        x = np.zeros((1, 4), np.float32)
        np.testing.assert_array_equal(pool.infer("add", x)[0], x + 1)  # fell back to CPU
