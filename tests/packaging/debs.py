"""The packages under test: edgefleet-agent and edgefleet-server for amd64, built once per
session at two versions (the upgrade installs the second over the first), and whether
this machine can boot the container the tests install them in (see nspawn.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.packaging.nspawn import ROOT, can_boot

BUILD = ROOT / "packaging" / "deb" / "build.py"
DIST = ROOT / ".cache" / "packaging" / "dist-test"
ARCH = "amd64"
VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]  # type: ignore[index]
NEXT_VERSION = f"{VERSION}+1"
"""The upgrade's version: sorts after VERSION for dpkg, and is a PEP 440 local version."""


@dataclass(frozen=True)
class Debs:
    """The packages under test: ``part -> version -> .deb``."""

    files: dict[str, dict[str, Path]]

    def __call__(self, part: str, version: str = VERSION) -> Path:
        return self.files[part][version]

    def depends(self, part: str) -> list[str]:
        """The Debian packages ``part`` depends on (first of each alternative)."""
        names = []
        for name in ("Depends", "Pre-Depends"):
            value = subprocess.run(
                ["dpkg-deb", "-f", str(self(part)), name],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            for item in value.split(","):
                first = item.split("|")[0].strip()
                if first:
                    names.append(re.split(r"[\s(]", first, maxsplit=1)[0])
        return sorted(set(names))


@pytest.fixture(scope="session", autouse=True)
def _can_boot() -> None:
    why = can_boot()
    if why is not None:
        pytest.fail(f"the package tests boot a container: {why}", pytrace=False)


@pytest.fixture(scope="session")
def debs() -> Debs:
    """edgefleet-agent and edgefleet-server for amd64, at VERSION and NEXT_VERSION."""
    DIST.mkdir(parents=True, exist_ok=True)
    files: dict[str, dict[str, Path]] = {}
    for part in ("agent", "server"):
        for version in (VERSION, NEXT_VERSION):
            out = DIST / version
            cmd = [sys.executable, str(BUILD), "--part", part, "--arch", ARCH]
            cmd += ["--version", version, "--out", str(out), "--compression", "none"]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, check=False)
            if done.returncode != 0:
                pytest.fail(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
            found = sorted(out.glob(f"edgefleet-{part}_*_{ARCH}.deb"))
            assert len(found) == 1, f"expected one edgefleet-{part} .deb in {out}: {found}"
            files.setdefault(part, {})[version] = found[0]
    return Debs(files)
