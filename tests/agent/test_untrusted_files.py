"""Files from removable media, the fleet or an operator: size checked before the rest is
read, and depth, numbers and Unicode checked before any other parser sees them."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from tuf.api.metadata import Targets  # type: ignore[attr-defined, unused-ignore]

from agent.config import parse_config
from agent.directives.sideload import sideload
from agent.kernel.errors import BundleError, EdgefleetError
from agent.kernel.readlimit import read_at_most
from agent.update.directive import MAX_DIRECTIVE_BYTES, verify_directive
from agent.update.errors import DirectiveRefused, TrustRootError
from agent.update.trust import MAX_ROOT_BYTES, ROOT_FILE, AppliedCounter, trusted_root
from agent.wire.manifest import load_manifest, parse_manifest
from agent.wire.untrusted import PayloadTooLarge

HUGE = 8 << 30  # a sparse 8 GiB file: reading it whole would exhaust the machine
DEEP = b"[" * 100_000 + b"]" * 100_000


def _sparse(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.truncate(size)
    return path


def test_a_huge_file_is_refused_after_reading_one_byte_past_the_limit(tmp_path: Path) -> None:
    path = _sparse(tmp_path / "big.json", HUGE)
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge) as info:
            read_at_most(path, 4096, "directive")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert (info.value.size, info.value.limit) == (HUGE, 4096)
    assert str(path) in str(info.value)
    assert read_at_most(_sparse(tmp_path / "ok", 4096), 4096, "x") == bytes(4096)


def test_a_side_loaded_directive_over_its_limit_is_refused_naming_the_file(
    tmp_path: Path,
) -> None:
    medium = tmp_path / "usb"
    (medium / "metadata").mkdir(parents=True)
    (medium / "targets").mkdir()
    directive = _sparse(medium / "directives" / "dev-1.json", HUGE)
    cfg = parse_config({"agent": {"device_id": "dev-1", "state_dir": str(tmp_path / "state")}})
    with pytest.raises(EdgefleetError) as info:
        sideload(medium, cfg)
    assert str(directive) in str(info.value)
    assert f"over the limit of {MAX_DIRECTIVE_BYTES} bytes" in str(info.value)
    assert not (tmp_path / "state").exists()  # refused before anything was set up


def test_a_trusted_root_over_its_limit_is_refused_naming_the_file(tmp_path: Path) -> None:
    root = _sparse(tmp_path / ROOT_FILE, HUGE)
    with pytest.raises(TrustRootError) as info:
        trusted_root(tmp_path)
    assert str(root) in str(info.value)
    assert str(MAX_ROOT_BYTES) in str(info.value)
    assert root.stat().st_size == HUGE  # refused, never deleted


def test_an_oversized_or_deep_directive_counter_reads_as_zero_and_is_counted(
    tmp_path: Path,
) -> None:
    counter = AppliedCounter(tmp_path)
    _sparse(counter.path, HUGE)
    assert counter.read().counter == 0
    counter.path.write_bytes(DEEP[:2000] + DEEP[-2000:])
    assert counter.read().counter == 0
    assert counter.unreadable == 2
    counter.path.write_text(json.dumps({"counter": 7, "digest": "ab"}))
    assert counter.read().counter == 7


def test_a_deep_directive_is_refused_as_not_a_targets_document() -> None:
    with pytest.raises(DirectiveRefused, match="nested deeper than 32 levels"):
        verify_directive(
            DEEP[:30_000] + DEEP[-30_000:], Targets(), device_id="d", hardware_class="h"
        )
    with pytest.raises(DirectiveRefused, match="lone surrogate"):
        verify_directive(b'{"signed": "\\ud800"}', Targets(), device_id="d", hardware_class="h")


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (DEEP, "nested deeper than 32 levels"),
        (b'{"name": "\\udc00"}', "lone surrogate"),
        (b'{"release": 1e999}', "out of range"),
        (b'{"release": ' + b"9" * 30 + b"}", "out of range"),
    ],
)
def test_a_hostile_manifest_is_one_bundle_error_naming_the_file(
    tmp_path: Path, data: bytes, words: str
) -> None:
    (tmp_path / "manifest.json").write_bytes(data)
    with pytest.raises(BundleError) as info:
        load_manifest(tmp_path)
    assert info.value.path == str(tmp_path / "manifest.json")
    assert words in info.value.reason
    with pytest.raises(BundleError, match=words):
        parse_manifest(data, "m")


def test_fleetctl_bundle_build_on_a_deep_manifest_is_one_line_naming_the_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "manifest.json").write_bytes(DEEP)
    proc = subprocess.run(
        [sys.executable, "-m", "fleet_server.cli.fleetctl", "bundle", "build", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    assert str(tmp_path / "manifest.json") in lines[0]
    assert "nested deeper than 32 levels" in lines[0]
    assert (tmp_path / "manifest.json").read_bytes() == DEEP  # not rewritten
