"""``--profile auto`` is the runtime's own detection, with its reason kept; a name or a
path is taken as given; an unknown name is an error naming the known ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.setup.profile import choose_profile
from runtime.errors import ProfileError


def test_auto_on_a_jetson_device_tree_picks_the_orin_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EDGEFLEET_PROFILE", raising=False)
    model = tmp_path / "model"
    model.write_bytes(b"NVIDIA Jetson Orin Nano Developer Kit\x00")
    chosen = choose_profile(device_tree_model_path=str(model), machine="aarch64")
    assert chosen.name == "jetson-orin"
    assert chosen.reason.startswith("auto: ")
    assert "Jetson Orin Nano" in chosen.reason


def test_auto_on_x86_without_a_device_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEFLEET_PROFILE", raising=False)
    chosen = choose_profile(device_tree_model_path=str(tmp_path / "none"), machine="x86_64")
    assert chosen.name == "x86-gateway"
    assert "machine x86_64" in chosen.reason


def test_a_name_is_taken_and_an_unknown_one_names_the_known() -> None:
    assert choose_profile("arm64-gateway").reason == "given"
    with pytest.raises(ProfileError, match="x86-gateway"):
        choose_profile("no-such-profile")
