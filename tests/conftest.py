"""Shared fixtures: small ONNX models built at test time, the real pretrained models,
and a guard that no shared-memory segment outlives the test session.

The generated models have exact, known outputs, so a test can tell a right answer from
a wrong one without a reference implementation:

- ``add_model``: ``y = x + 1`` on a float32 ``[1, 4]`` input "x";
- ``image_model``: the per-channel mean of a float32 ``[1, 3, 8, 8]`` NCHW image;
- ``slow_model``: a chain of 256x256 MatMuls with an identity weight (``y = x``), its
  length calibrated here so one run takes ~40 ms on one core;
- ``batch_model``: ``y = x * 2`` on ``["N", 4]``;
- ``reshape_model``: ``reshape(x, shape)``, which fails at run time for a bad shape;
- ``custom_op_model``: an operator from a custom domain ONNX Runtime doesn't know.

The real models come from ``make models`` into ``.cache/models``; a missing one fails
the test that needs it (never a skip: a skip would hide a broken setup in CI).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.support.broker import Broker, start_broker

REPO = Path(__file__).resolve().parent.parent
OPSET = 17
IR_VERSION = 9  # an IR version every ONNX Runtime since 1.15 reads, 1.31 included

SLOW_TARGET_S = 0.040  # one run of slow_model on one core
SLOW_SIZE = 256


def _save(model: onnx.ModelProto, path: Path) -> str:
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def _model(graph: onnx.GraphProto, *extra_opsets: onnx.OperatorSetIdProto) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", OPSET), *extra_opsets]
    return helper.make_model(graph, opset_imports=opsets, producer_name="edgefleet-tests")


def _f32(name: str, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def add_model(model_dir: Path) -> str:
    """float32 x [1, 4] -> y = x + 1."""
    one = numpy_helper.from_array(np.ones((1, 4), np.float32), "one")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])],
        "add_one",
        [_f32("x", [1, 4])],
        [_f32("y", [1, 4])],
        [one],
    )
    return _save(_model(graph), model_dir / "add.onnx")


@pytest.fixture(scope="session")
def image_model(model_dir: Path) -> str:
    """float32 x [1, 3, 8, 8] (NCHW) -> y [1, 3]: the mean of each channel."""
    # Opset 17's ReduceMean takes its axes as an attribute (an input from opset 18 on).
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=0)],
        "channel_mean",
        [_f32("x", [1, 3, 8, 8])],
        [_f32("y", [1, 3])],
    )
    return _save(_model(graph), model_dir / "image.onnx")


def _slow_graph(repeats: int) -> onnx.ModelProto:
    eye = numpy_helper.from_array(np.eye(SLOW_SIZE, dtype=np.float32), "w")
    nodes = []
    prev = "x"
    for i in range(repeats):
        out = "y" if i == repeats - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, "w"], [out]))
        prev = out
    graph = helper.make_graph(
        nodes,
        "slow_chain",
        [_f32("x", [SLOW_SIZE, SLOW_SIZE])],
        [_f32("y", [SLOW_SIZE, SLOW_SIZE])],
        [eye],
    )
    return _model(graph)


def _median_run_s(path: str, runs: int = 5) -> float:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    x = np.ones((SLOW_SIZE, SLOW_SIZE), np.float32)
    session.run(None, {"x": x})  # warm-up
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run(None, {"x": x})
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


@pytest.fixture(scope="session")
def _slow_model_calibrated(model_dir: Path) -> tuple[str, float]:
    probe = _save(_slow_graph(20), model_dir / "slow_probe.onnx")
    per_matmul = _median_run_s(probe) / 20
    repeats = max(20, min(2000, math.ceil(SLOW_TARGET_S / per_matmul)))
    path = _save(_slow_graph(repeats), model_dir / "slow.onnx")
    return path, _median_run_s(path, runs=3)


@pytest.fixture(scope="session")
def slow_model(_slow_model_calibrated: tuple[str, float]) -> str:
    """float32 x [256, 256] -> y = x, through a chain of MatMuls taking ~40 ms."""
    return _slow_model_calibrated[0]


@pytest.fixture(scope="session")
def slow_model_run_s(_slow_model_calibrated: tuple[str, float]) -> float:
    """The measured median time of one slow_model run on one core, in seconds."""
    return _slow_model_calibrated[1]


@pytest.fixture(scope="session")
def batch_model(model_dir: Path) -> str:
    """float32 x ["N", 4] -> y = x * 2."""
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        "times_two",
        [_f32("x", ["N", 4])],
        [_f32("y", ["N", 4])],
        [two],
    )
    return _save(_model(graph), model_dir / "batch.onnx")


@pytest.fixture(scope="session")
def reshape_model(model_dir: Path) -> str:
    """float32 x [1, 4], int64 shape [2] -> y = reshape(x, shape).

    A shape of (0, 0) keeps x's; one that doesn't hold 4 values fails at run time, in
    the backend, which is how a test provokes an inference error.
    """
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "reshape",
        [_f32("x", [1, 4]), helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [_f32("y", ["a", "b"])],
    )
    return _save(_model(graph), model_dir / "reshape.onnx")


@pytest.fixture(scope="session")
def custom_op_model(model_dir: Path) -> str:
    """A valid ONNX file whose only node is com.edgefleet.test::Frobnicate."""
    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.edgefleet.test")],
        "custom_op",
        [_f32("x", [1, 4])],
        [_f32("y", [1, 4])],
    )
    model = _model(graph, helper.make_opsetid("com.edgefleet.test", 1))
    return _save(model, model_dir / "custom_op.onnx")


@pytest.fixture(scope="session")
def real_models_dir() -> Path:
    """``.cache/models`` in this checkout; fails (not skips) when it was never fetched."""
    directory = REPO / ".cache" / "models"
    if not directory.is_dir():
        pytest.fail(f"{directory} is missing: run `make models` to fetch the pretrained models")
    return directory


@pytest.fixture(scope="session")
def real_model(real_models_dir: Path) -> Callable[[str], str]:
    """``real_model("ppocr_v4_det.onnx")``: the path of a fetched pretrained model."""

    def path_of(name: str) -> str:
        path = real_models_dir / name
        if not path.is_file() or path.stat().st_size == 0:
            pytest.fail(f"{path} is missing: run `make models` to fetch the pretrained models")
        return str(path)

    return path_of


def _own_segments() -> set[str]:
    from runtime._internal.shm import shm_dir

    return {p.name for p in shm_dir().glob(f"edgefleet-{os.getpid()}-*")}


@pytest.fixture(scope="session", autouse=True)
def _no_leaked_segments() -> Iterator[None]:
    """Every pool the tests start must unlink its shared memory when it closes."""
    before = _own_segments()
    yield
    leaked = _own_segments() - before
    assert not leaked, f"shared-memory segments left behind: {sorted(leaked)}"


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A real Mosquitto on a free 127.0.0.1 port for the whole session."""
    broker = start_broker(tmp_path_factory.mktemp("mosquitto"))
    yield broker
    broker.stop()


@pytest.fixture
def own_mosquitto(tmp_path: Path) -> Iterator[Broker]:
    """A Mosquitto of this test's own, which the test may stop and start again."""
    workdir = tmp_path / "broker"
    workdir.mkdir()
    broker = start_broker(workdir)
    yield broker
    broker.stop()


def _utf8_safe(text: str) -> str:
    """``text`` with what UTF-8 can't encode (a lone surrogate a hostile-input test logged)
    written as a backslash escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Make each report's captured output encodable: make test runs the files in
    pytest-xdist workers, which send reports to the controller as UTF-8, and the hostile
    input tests log lone surrogates on purpose (a worker would crash sending them)."""
    report = yield
    report.sections = [(title, _utf8_safe(content)) for title, content in report.sections]
    if isinstance(report.longrepr, str):
        report.longrepr = _utf8_safe(report.longrepr)
    return report


# The files that take 20 s or more (``pytest --durations=0``, summed per file), slowest
# first. make test runs whole files on its workers (``--dist loadfile``) in collection
# order; starting with the longest ones lets the workers finish together instead of one
# running a long end-to-end file alone at the end.
SLOW_FILES_FIRST = (
    "tests/fleet_server/test_quality_e2e.py",
    "tests/agent/capture/test_capture_decoders.py",
    "tests/agent/test_agent_run.py",
    "tests/hil/bench/test_bench_drain.py",
    "tests/agent/capture/test_capture_rtsp.py",
    "tests/agent/test_process_split.py",
    "tests/fleet_server/test_review_api.py",
    "tests/fleet_server/test_fleetctl_users.py",
    "tests/fleet_server/test_signed_delivery.py",
    "tests/fleet_server/test_auth.py",
    "tests/fleet_server/test_fleet_e2e.py",
    "tests/fleet_server/test_rollback_e2e.py",
    "tests/fleet_server/web/test_console_rollback.py",
    "tests/fleet_server/test_fleetctl_repo.py",
    "tests/fleet_server/test_fleetctl_fleet.py",
    "tests/fleet_server/test_review_store.py",
    "tests/hil/bench/test_bench_cluster.py",
    "tests/agent/setup/test_setup.py",
    "tests/packaging_build/test_deb_contents.py",
    "tests/agent/installer/test_power_loss.py",
    "tests/fleet_server/web/test_console_browser.py",
    "tests/agent/test_bench_rtsp.py",
    "tests/fleet_server/test_server_setup.py",
    "tests/agent/test_watchdog.py",
    "tests/fleet_server/test_db_store.py",
    "tests/hil/bench/test_bench_review.py",
    "tests/fleet_server/test_broker_acl.py",
    "tests/fleet_server/test_fleet_serve.py",
    "tests/hil/bench/test_bench_restart.py",
    "tests/security/test_hostile_device.py",
    "tests/agent/discovery/test_cameras_discovery.py",
    "tests/agent/installer/test_shadow_install.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run :data:`SLOW_FILES_FIRST` first, in that order; the rest keep their order."""
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
