"""Firmware profiles: the bundled TOML files, the schema's errors, auto detection."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pydantic
import pytest

from runtime.errors import ProfileError
from runtime.profiles import ENV_VAR, Profile, list_profiles, load_profile

BUNDLED = ["arm64-gateway", "jetson-orin", "x86-gateway"]

VALID = """\
name = "test-board"
description = "A board for tests."
cores = [0, 1]
workers = "auto"
threads_per_worker = 1
execution_providers = ["CPUExecutionProvider"]
tflite_delegates = ["xnnpack"]
memory_budget_mb = 256
spin_wait = false

[match]
machine = ["x86_64"]
"""


@pytest.fixture(autouse=True)
def _no_profile_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


def write(tmp_path: Path, text: str, name: str = "test-board.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def replace_line(key: str, line: str) -> str:
    """VALID with the line assigning ``key`` replaced by ``line``."""
    lines = VALID.splitlines()
    index = next(i for i, text in enumerate(lines) if text.startswith(f"{key} ="))
    lines[index] = line
    return "\n".join(lines) + "\n"


def device_tree(tmp_path: Path, model: str) -> str:
    path = tmp_path / "model"
    path.write_bytes(model.encode() + b"\x00")  # the kernel's property ends in a NUL
    return str(path)


# --- bundled profiles ------------------------------------------------------------------


def test_bundled_profiles_are_listed_by_name() -> None:
    assert list_profiles() == BUNDLED


@pytest.mark.parametrize("name", BUNDLED)
def test_every_bundled_profile_loads_and_validates(name: str) -> None:
    profile = load_profile(name)

    assert profile.name == name
    assert profile.description.strip()
    assert profile.execution_providers[-1] == "CPUExecutionProvider"
    assert profile.match.device_tree_model or profile.match.machine


def test_bundled_profiles_carry_the_providers_of_their_device_class() -> None:
    jetson = load_profile("jetson-orin")
    arm = load_profile("arm64-gateway")
    x86 = load_profile("x86-gateway")

    assert jetson.execution_providers == (
        "TensorrtExecutionProvider",
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    )
    assert jetson.tflite_delegates == ("gpu", "xnnpack")
    assert arm.execution_providers == ("XnnpackExecutionProvider", "CPUExecutionProvider")
    assert arm.tflite_delegates == ("xnnpack",)
    assert x86.execution_providers == ("CPUExecutionProvider",)
    assert x86.cores == "all"


def test_jetson_profile_leaves_cores_0_and_1_to_capture_and_os() -> None:
    jetson = load_profile("jetson-orin")

    assert jetson.cores != "all"
    assert min(jetson.cores) == 2
    assert max(jetson.cores) == 11  # AGX Orin has 12 cores


def test_profile_loads_from_a_path(tmp_path: Path) -> None:
    path = write(tmp_path, VALID)

    profile = load_profile(str(path))

    assert profile.name == "test-board"
    assert profile.cores == (0, 1)
    assert profile.threads_per_worker == 1
    assert profile.spin_wait is False


def test_profile_is_immutable(tmp_path: Path) -> None:
    profile = load_profile(str(write(tmp_path, VALID)))

    with pytest.raises(pydantic.ValidationError):
        profile.workers = 3  # type: ignore[misc]


# --- errors --------------------------------------------------------------------------


def test_unknown_top_level_key_is_rejected_naming_file_and_field(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace("spin_wait = false", "spin_wait = false\nworkerz = 2"))

    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))

    assert caught.value.path == str(path)
    assert caught.value.field == "workerz"
    assert "unknown key" in caught.value.reason
    assert str(path) in str(caught.value)


def test_unknown_nested_key_is_rejected_with_its_dotted_field(tmp_path: Path) -> None:
    path = write(tmp_path, VALID + 'device_tree_modle = ["Jetson"]\n')

    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))

    assert caught.value.path == str(path)
    assert caught.value.field == "match.device_tree_modle"
    assert "device_tree_model" in caught.value.reason  # lists the keys allowed there


@pytest.mark.parametrize(
    ("line", "field", "words"),
    [
        ("workers = 0", "workers", ">= 1"),
        ('workers = "many"', "workers", "'many'"),
        ("workers = 3", "workers", "only 2 cores"),
        ("workers = true", "workers", "integer"),
        ("threads_per_worker = -1", "threads_per_worker", "greater than or equal to 1"),
        ('threads_per_worker = "2"', "threads_per_worker", "integer"),
        ("cores = [0, 0]", "cores", "twice"),
        ("cores = [-1]", "cores", ">= 0"),
        ("cores = []", "cores", "at least one"),
        ('cores = "some"', "cores", '"all"'),
        ("execution_providers = []", "execution_providers", "at least 1"),
        ('execution_providers = ["cuda", "CUDA"]', "execution_providers", "twice"),
        ('tflite_delegates = ["npu"]', "tflite_delegates[0]", "'gpu'"),
        ("memory_budget_mb = 0", "memory_budget_mb", "greater than 0"),
        ('spin_wait = "yes"', "spin_wait", "boolean"),
        ('name = "Test Board"', "name", "not a profile name"),
    ],
)
def test_bad_value_is_rejected_naming_file_and_field(
    tmp_path: Path, line: str, field: str, words: str
) -> None:
    key = line.partition(" =")[0]
    path = write(tmp_path, replace_line(key, line))

    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))

    assert caught.value.path == str(path)
    assert caught.value.field == field
    assert words in caught.value.reason


def test_missing_required_field_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, replace_line("memory_budget_mb", ""))

    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))

    assert caught.value.field == "memory_budget_mb"
    assert "required" in caught.value.reason.lower()


def test_several_bad_values_report_the_first_and_count_the_rest(tmp_path: Path) -> None:
    text = replace_line("threads_per_worker", "threads_per_worker = 0")
    text = text.replace("memory_budget_mb = 256", "memory_budget_mb = -5")
    path = write(tmp_path, text)

    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))

    assert caught.value.field == "threads_per_worker"
    assert "1 more error" in caught.value.reason


def test_toml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace('workers = "auto"', "workers = "))

    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))

    assert caught.value.path == str(path)
    assert caught.value.field is None
    assert "line 4" in caught.value.reason


def test_unknown_profile_name_lists_the_known_ones() -> None:
    with pytest.raises(ProfileError) as caught:
        load_profile("jetson-nano-classic")

    assert caught.value.path == "jetson-nano-classic"
    for name in BUNDLED:
        assert name in caught.value.reason


def test_missing_profile_file_is_rejected_listing_the_known_ones(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"

    with pytest.raises(ProfileError) as caught:
        load_profile(str(missing))

    assert caught.value.path == str(missing)
    assert "jetson-orin" in caught.value.reason


def test_named_profile_must_carry_its_file_name(tmp_path: Path) -> None:
    write(tmp_path, VALID, name="other-board.toml")

    with pytest.raises(ProfileError) as caught:
        load_profile("other-board", profiles_dir=tmp_path)

    assert caught.value.field == "name"
    assert "test-board" in caught.value.reason


def test_profiles_dir_replaces_the_bundled_profiles(tmp_path: Path) -> None:
    write(tmp_path, VALID)

    assert list_profiles(tmp_path) == ["test-board"]
    assert load_profile("test-board", profiles_dir=tmp_path).memory_budget_mb == 256


# --- auto detection ------------------------------------------------------------------


def test_auto_picks_jetson_orin_from_the_device_tree(tmp_path: Path) -> None:
    model = device_tree(tmp_path, "NVIDIA Jetson AGX Orin Developer Kit")

    profile = load_profile("auto", device_tree_model_path=model, machine="aarch64")

    assert profile.name == "jetson-orin"


def test_auto_prefers_the_device_tree_over_the_machine(tmp_path: Path) -> None:
    # A simulated Jetson on an x86 test host: the device tree decides.
    model = device_tree(tmp_path, "NVIDIA Jetson Orin Nano Developer Kit")

    profile = load_profile("auto", device_tree_model_path=model, machine="x86_64")

    assert profile.name == "jetson-orin"


def test_auto_picks_arm64_gateway_for_a_raspberry_pi_5(tmp_path: Path) -> None:
    model = device_tree(tmp_path, "Raspberry Pi 5 Model B Rev 1.0")

    profile = load_profile("auto", device_tree_model_path=model, machine="aarch64")

    assert profile.name == "arm64-gateway"


def test_auto_falls_back_to_arm64_gateway_on_an_unknown_aarch64_board(tmp_path: Path) -> None:
    model = device_tree(tmp_path, "Radxa ROCK 5B")

    profile = load_profile("auto", device_tree_model_path=model, machine="arm64")

    assert profile.name == "arm64-gateway"


def test_auto_picks_x86_gateway_without_a_device_tree(tmp_path: Path) -> None:
    profile = load_profile(
        "auto", device_tree_model_path=str(tmp_path / "absent"), machine="x86_64"
    )

    assert profile.name == "x86-gateway"


def test_auto_logs_the_profile_chosen_and_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = device_tree(tmp_path, "Raspberry Pi 5 Model B Rev 1.0")

    with caplog.at_level(logging.INFO, logger="runtime.profiles"):
        load_profile("auto", device_tree_model_path=model, machine="aarch64")

    assert "arm64-gateway" in caplog.text
    assert "Raspberry Pi 5" in caplog.text


def test_auto_with_no_matching_profile_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as caught:
        load_profile("auto", device_tree_model_path=str(tmp_path / "absent"), machine="riscv64")

    assert "riscv64" in caught.value.reason
    assert "jetson-orin" in caught.value.reason


def test_environment_variable_overrides_auto_detection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = device_tree(tmp_path, "NVIDIA Jetson AGX Orin Developer Kit")
    monkeypatch.setenv(ENV_VAR, "x86-gateway")

    profile = load_profile("auto", device_tree_model_path=model, machine="aarch64")

    assert profile.name == "x86-gateway"


def test_environment_variable_may_name_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, str(write(tmp_path, VALID)))

    profile = load_profile("auto", device_tree_model_path=str(tmp_path / "absent"))

    assert profile.name == "test-board"


def test_explicit_name_wins_over_the_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_VAR, "x86-gateway")

    assert load_profile("jetson-orin").name == "jetson-orin"


# --- resolving cores and workers -----------------------------------------------------


def test_resolve_cores_keeps_the_listed_cores_that_are_available(
    caplog: pytest.LogCaptureFixture,
) -> None:
    jetson = load_profile("jetson-orin")  # cores 2..11

    with caplog.at_level(logging.WARNING, logger="runtime.profiles"):
        cores = jetson.resolve_cores({0, 1, 2, 3, 4, 5})  # an Orin Nano

    assert cores == [2, 3, 4, 5]
    assert "6,7,8,9,10,11" in caplog.text


def test_resolve_cores_falls_back_to_the_available_ones_when_none_remain(
    caplog: pytest.LogCaptureFixture,
) -> None:
    jetson = load_profile("jetson-orin")

    with caplog.at_level(logging.WARNING, logger="runtime.profiles"):
        cores = jetson.resolve_cores({1, 0})  # a 2-core test machine

    assert cores == [0, 1]
    assert "none of its cores" in caplog.text


def test_resolve_cores_all_means_this_process_affinity() -> None:
    x86 = load_profile("x86-gateway")

    assert x86.resolve_cores() == sorted(os.sched_getaffinity(0))
    assert x86.resolve_cores({7, 3}) == [3, 7]


def test_resolve_cores_with_no_available_core_is_an_error() -> None:
    with pytest.raises(ValueError, match="no CPU cores"):
        load_profile("x86-gateway").resolve_cores(set())


def test_resolve_workers_auto_is_one_per_resolved_core() -> None:
    arm = load_profile("arm64-gateway")  # cores 1, 2, 3

    assert arm.resolve_workers({0, 1, 2, 3}) == 3
    assert arm.resolve_workers({0, 1}) == 1


def test_resolve_workers_caps_explicit_workers_at_the_resolved_cores(
    caplog: pytest.LogCaptureFixture,
) -> None:
    jetson = load_profile("jetson-orin")  # workers = 4

    assert jetson.resolve_workers(set(range(12))) == 4
    with caplog.at_level(logging.WARNING, logger="runtime.profiles"):
        assert jetson.resolve_workers({0, 1}) == 2
    assert "running 2 workers" in caplog.text


def test_profile_schema_documents_every_field() -> None:
    schema = Profile.model_json_schema()

    undocumented = [key for key, spec in schema["properties"].items() if "description" not in spec]
    assert undocumented == []


def test_a_reserved_hotpath_core_is_left_out_of_the_workers_only_past_two_cores() -> None:
    x86 = load_profile("x86-gateway")
    assert x86.processes.hotpath_core == "reserved"
    assert x86.hotpath_cpus({0, 1, 2, 3}) == {0}
    assert x86.resolve_cores({0, 1, 2, 3}) == [1, 2, 3]
    assert x86.resolve_workers({0, 1, 2, 3}) == 3
    # two cores: both run workers, the hot path floats (no core to spare)
    assert x86.hotpath_cpus({0, 1}) is None
    assert x86.resolve_cores({0, 1}) == [0, 1]


def test_a_listed_profile_reserves_the_cores_its_list_leaves_out() -> None:
    jetson = load_profile("jetson-orin")
    assert jetson.hotpath_cpus(set(range(6))) == {0, 1}
    assert jetson.resolve_cores(set(range(6))) == [2, 3, 4, 5]
    shared = jetson.model_copy(
        update={"processes": jetson.processes.model_copy(update={"hotpath_core": "shared"})}
    )
    assert shared.hotpath_cpus(set(range(6))) is None
