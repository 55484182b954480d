"""The inline execution mode, the profile's per-backend provider lists, and the profile's
execution and process fields, on real models."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from runtime import ModelConfig, PoolConfig, PreprocessSpec, WorkerPool
from runtime.errors import DeadlineExceeded
from runtime.profiles import load_profile

REPO = Path(__file__).resolve().parents[2]
TFLITE = REPO / "tests" / "data" / "tiny_classifier.tflite"


def _ppocr(real_model: Callable[[str], str]) -> ModelConfig:
    path = real_model("ppocr_mobile_v2_cls.onnx")
    return ModelConfig("cls", path, input_shapes={"x": (1, 3, 48, 192)})


def test_inline_mode_gives_the_same_outputs_as_the_pool(real_model: Callable[[str], str]) -> None:
    x = np.random.default_rng(3).random((1, 3, 48, 192), dtype=np.float32)
    with WorkerPool([_ppocr(real_model)], PoolConfig(workers=1, pin=False)) as pool:
        expected = pool.infer("cls", x)[0]
    config = PoolConfig(workers=1, pin=False, execution_mode="inline")
    with WorkerPool([_ppocr(real_model)], config) as pool:
        assert pool.execution_mode == "inline"
        assert pool.worker_pids() == []  # no worker processes
        assert pool.ready_workers() == 1
        req = pool.submit("cls", x)
        assert req.done()  # ran on this thread before submit returned
        with req.wait(1.0):
            np.testing.assert_allclose(req.outputs[0], expected, rtol=1e-5, atol=1e-6)
        with pool.reserve("cls") as slot:
            slot.inputs[0][...] = x
            again = slot.submit()
        with again:
            np.testing.assert_allclose(again.outputs[0], expected, rtol=1e-5, atol=1e-6)
        stats = pool.stats()
        assert stats["models"]["cls"]["counts"]["completed"] == 2
        assert stats["models"]["cls"]["stages"]["inference"]["count"] == 2
        assert stats["restarts"] == 0
        assert pool.degraded is None
        assert pool.queued("cls") == 0


def test_inline_threads_each_take_a_lane_pinned_to_its_own_core(
    real_model: Callable[[str], str],
) -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("hardware: one core can't show two lanes on two cores")  # pragma: no cover
    config = PoolConfig(workers=2, cores=tuple(cores[:2]), execution_mode="inline")
    seen: dict[str, set[int]] = {}
    x = np.zeros((1, 3, 48, 192), np.float32)

    def run(name: str) -> None:
        with pool.submit("cls", x).wait(5.0):
            pass
        seen[name] = os.sched_getaffinity(0)

    with WorkerPool([_ppocr(real_model)], config) as pool:
        threads = [threading.Thread(target=run, args=(f"t{i}",)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert sorted(next(iter(s)) for s in seen.values()) == cores[:2]
    assert all(len(s) == 1 for s in seen.values())


def test_inline_mode_preprocesses_frames_and_drops_a_request_past_its_deadline(
    image_model: str,
) -> None:
    model = ModelConfig(
        "img", image_model, preprocess=PreprocessSpec(), max_frame_bytes=64 * 64 * 3
    )
    frame = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    with WorkerPool([model], PoolConfig(workers=1, pin=False)) as pool:
        expected = pool.infer("img", frame=frame)[0]
    config = PoolConfig(workers=1, pin=False, execution_mode="inline")
    with WorkerPool([model], config) as pool:
        got = pool.infer("img", frame=frame)[0]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        late = pool.submit("img", frame=frame, deadline_s=-1.0)
        with pytest.raises(DeadlineExceeded):
            late.wait(1.0)
        assert pool.stats()["models"]["img"]["counts"]["expired"] == 1


def test_onnx_providers_of_a_profile_never_reach_the_litert_backend(
    caplog: pytest.LogCaptureFixture,
) -> None:
    profile = load_profile("x86-gateway")
    assert "CPUExecutionProvider" in profile.execution_providers
    config = PoolConfig.from_profile(profile, workers=1, pin=False)
    assert config.providers == tuple(profile.execution_providers)
    assert config.delegates == tuple(profile.tflite_delegates)
    caplog.set_level(logging.WARNING)
    for mode in ("pool", "inline"):
        cfg = PoolConfig.from_profile(profile, workers=1, pin=False, execution_mode=mode)
        with WorkerPool([ModelConfig("tiny", str(TFLITE))], cfg) as pool:
            x = np.zeros(pool.models[0].inputs[0].concrete_shape(), np.float32)
            pool.infer("tiny", x)
    warned = [r.getMessage() for r in caplog.records if "not supported" in r.getMessage()]
    assert warned == []


def test_profiles_carry_execution_and_process_defaults() -> None:
    for name in ("x86-gateway", "arm64-gateway", "jetson-orin"):
        profile = load_profile(name)
        assert profile.execution_mode in ("pool", "inline")
        assert profile.handoff_spin_us >= 0
        assert 0 <= profile.processes.companion_nice <= 19
        assert profile.processes.companion_sched in ("other", "batch", "idle")
        config = PoolConfig.from_profile(profile)
        assert config.execution_mode == profile.execution_mode
        assert config.pipelining == profile.pipelining
        assert config.spin_us == profile.handoff_spin_us
    default = load_profile("jetson-orin").processes
    assert (default.hotpath_nice, default.companion_nice, default.companion_sched) == (
        0,
        10,
        "batch",
    )
