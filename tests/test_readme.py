"""The README's examples run, so they can't rot."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def toml_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```toml\n(.*?)```", text, flags=re.DOTALL)


def test_readme_has_a_runtime_example() -> None:
    blocks = python_blocks()
    assert blocks, "README.md has no python example"
    assert any("WorkerPool" in b for b in blocks)


def test_readme_runtime_example_runs_and_prints_what_it_says(real_models_dir: Path) -> None:
    del real_models_dir  # the fixture makes sure `make models` has run
    (block,) = [b for b in python_blocks() if "WorkerPool" in b]
    # `python -c`: spawned workers don't re-run a __main__ that has no file.
    proc = subprocess.run(
        [sys.executable, "-c", block],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    expected = re.findall(r"# (\(1, 2\)|2)$", block, flags=re.MULTILINE)
    assert proc.stdout.split() == ["(1,", "2)", "2"], proc.stdout
    assert expected == ["(1, 2)", "2"]


def test_readme_agent_config_is_a_valid_config() -> None:
    from agent.config import parse_config

    block = toml_blocks()[0]  # the first is the whole agent config
    cfg = parse_config(tomllib.loads(block), "README.md")
    assert [c.name for c in cfg.cameras] == ["cam1"]
    assert cfg.pipelines[0].chain[0].max_crops == 4
    assert cfg.pipelines[0].policy is not None
    assert [r.outcome for r in cfg.pipelines[0].policy.rules] == ["review", "reject", "review"]
    assert cfg.actions.actions[0].name == "robot"


def test_readme_rtsp_camera_is_a_valid_camera_of_the_agent_config() -> None:
    from agent.config import parse_config

    whole, *rest = toml_blocks()
    (rtsp,) = [b for b in rest if 'kind = "rtsp"' in b]
    raw = tomllib.loads(whole)
    raw["cameras"] = tomllib.loads(rtsp)["cameras"]
    raw["cameras"][0]["line"] = "line1"
    for p in raw["pipelines"]:
        p["source"] = "press-3"
    cfg = parse_config(raw, "README.md")
    (cam,) = cfg.cameras
    assert (cam.kind, cam.transport, cam.password_env) == ("rtsp", "tcp", "PRESS3_PASSWORD")
    assert cam.detect_uri is not None
    assert cam.detect_uri.endswith("/102")
