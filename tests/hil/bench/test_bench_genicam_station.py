"""``hil bench genicam-station`` on a small run: a station on a GigE Vision camera fired by
TriggerSoftware (the simulator on a link of its own) and on the synthetic camera, every
trigger answered with a decision, the GenICam decisions' capture times on the camera's
clock and the synthetic ones on the host's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.kernel.bundle import init_bundle

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[3]
TINY_TFLITE = REPO / "tests" / "data" / "tiny_classifier.tflite"
TRIGGERS = 10


def test_the_bench_answers_every_trigger_on_both_cameras_and_says_which_clock(
    tmp_path: Path,
) -> None:
    bundle = init_bundle(TINY_TFLITE, tmp_path / "tiny")
    out = tmp_path / "out.json"
    run = subprocess.run(
        [str(Path(sys.executable).parent / "hil"), "bench", "genicam-station",
         "--bundle", str(bundle.path), "--triggers", str(TRIGGERS), "--json", str(out)],
        capture_output=True, text=True, timeout=280, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    r = json.loads(out.read_text())
    for kind, clock in (("synthetic", "host"), ("genicam", "camera")):
        figures = r[kind]
        assert figures["answered"] == figures["decisions"] == TRIGGERS, json.dumps(r)
        assert figures["by_status"]["ok"] == TRIGGERS, json.dumps(r)
        assert figures["clock"] == {clock: TRIGGERS}
        assert 0 < figures["trigger_to_result_p50_ms"] <= figures["trigger_to_result_p99_ms"]
        assert figures["seen_to_capture_p50_ms"] >= 0  # taken after the trigger was seen
    camera = r["genicam"]["camera"]
    assert camera["frames"] == camera["software_triggers"] == TRIGGERS
    assert camera["missed_triggers"] == camera["incomplete_frames"] == 0
    assert "genicam_over_synthetic_ms" in r
    assert "the GenICam camera adds" in run.stdout
