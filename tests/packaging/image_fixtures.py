"""Fixtures of the image tests: both parts' OCI archives, built once per session from
the session's .debs the way ``make image`` builds them, each archive unpacked once as an
OCI layout and once as a root filesystem (``umoci unpack``).

They need root (mmdebstrap, umoci unpack keeping owners, systemd-nspawn) and are run by
``make package-test``, not ``make test``. ``IMAGE_DIST=DIR`` uses the archives already in
DIR instead of building them (for iterating on the tests).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.packaging.debs import VERSION, Debs
from tests.packaging.nspawn import ROOT

BUILD = ROOT / "packaging" / "oci" / "build.py"
ARCH = "amd64"
TOOLS = ("mmdebstrap", "umoci", "systemd-nspawn", "podman")
BUILD_TIMEOUT_S = 3600


@dataclass(frozen=True)
class PartSpec:
    """What each part's image must be."""

    name: str
    package: str
    user: str
    command: tuple[str, ...]
    ports: tuple[str, ...]

    @property
    def state_dir(self) -> str:
        return f"/var/lib/edgefleet/{self.name}"


PARTS = {
    "agent": PartSpec(
        "agent",
        "edgefleet-agent",
        "edgefleet",
        ("edge-agent", "run", "--config", "/etc/edgefleet/agent.toml"),
        ("9464/tcp",),
    ),
    "server": PartSpec(
        "server",
        "edgefleet-server",
        "edgefleet-server",
        ("fleet-server", "serve", "--config", "/etc/edgefleet/fleet.toml"),
        ("8080/tcp", "8883/tcp"),
    ),
}


@dataclass(frozen=True)
class Image:
    """One part's built image: the archive, its layout unpacked, its root filesystem."""

    spec: PartSpec
    archive: Path
    layout: Path
    rootfs: Path

    def blob(self, digest: str) -> bytes:
        algorithm, hexdigest = digest.split(":", 1)
        return (self.layout / "blobs" / algorithm / hexdigest).read_bytes()

    def manifest(self) -> dict:  # type: ignore[type-arg]
        index = json.loads((self.layout / "index.json").read_text())
        return json.loads(self.blob(index["manifests"][0]["digest"]))  # type: ignore[no-any-return]

    def config(self) -> dict:  # type: ignore[type-arg]
        return json.loads(self.blob(self.manifest()["config"]["digest"]))  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def archives(debs: Debs, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``part -> edgefleet-<part>-<version>-amd64.oci.tar``, built as ``make image`` does
    (packaging/oci/build.py) from the session's .debs. ``IMAGE_DIST=DIR`` takes the
    archives already in DIR instead (for iterating on the tests)."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not installed: apt install mmdebstrap umoci "
            "systemd-container podman (make package-test installs them)",
            pytrace=False,
        )
    given = os.environ.get("IMAGE_DIST")
    found = {}
    for part, spec in PARTS.items():
        if given:
            names = sorted(Path(given).glob(f"{spec.package}-*-{ARCH}.oci.tar"))
            assert names, f"no {spec.package} archive in {given}"
            found[part] = names[-1]
            continue
        out = tmp_path_factory.mktemp(f"oci-{part}")
        cmd = [sys.executable, str(BUILD), "--part", part, "--deb", str(debs(part))]
        cmd += ["--version", VERSION, "--out", str(out)]
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
        )
        if done.returncode != 0:
            pytest.fail(
                f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}",
                pytrace=False,
            )
        archive = out / f"{spec.package}-{VERSION}-{ARCH}.oci.tar"
        assert archive.is_file(), f"packaging/oci/build.py wrote no {archive}"
        found[part] = archive
    return found


@pytest.fixture(scope="session", params=sorted(PARTS))
def image(
    request: pytest.FixtureRequest,
    archives: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Image:
    """One part's image, its archive unpacked as a layout and as a root filesystem."""
    part: str = request.param
    base = tmp_path_factory.mktemp(f"image-{part}")
    layout = base / "layout"
    with tarfile.open(archives[part]) as tar:
        tar.extractall(layout, filter="data")
    index = json.loads((layout / "index.json").read_text())
    tag = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
    bundle = base / "bundle"
    subprocess.run(
        ["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return Image(PARTS[part], archives[part], layout, bundle / "rootfs")
