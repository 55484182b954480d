"""The agent's .deb for amd64, built once per session by packaging/deb/build.py and
unpacked with dpkg-deb, for the host-side checks (no container: ``make test`` runs them).

The build uses the project's wheel cache (.cache/packaging/wheels/amd64; the first run on
a machine downloads the pinned wheels) and no compression, so that it is quick.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEB_DIR = ROOT / "packaging" / "deb"
BUILD = DEB_DIR / "build.py"
PYPROJECT_VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[
    1
]  # type: ignore[index]
VERSION = f"{PYPROJECT_VERSION}+test1"
"""A version that is not pyproject's: the package and the wheel inside must both carry it."""


def load_module(name: str) -> ModuleType:
    """One of packaging/deb's modules, by its plain name (as they import each other; the
    directory is not a package: ``packaging`` is a PyPI distribution's name)."""
    if str(DEB_DIR) not in sys.path:
        sys.path.insert(0, str(DEB_DIR))
    module = importlib.import_module(name)
    assert Path(module.__file__ or "").parent == DEB_DIR, f"{name} is not packaging/deb's"
    return module


@dataclass(frozen=True)
class Built:
    """A built package, its control files and its unpacked tree."""

    deb: Path
    control: Path
    tree: Path

    def field(self, name: str) -> str:
        return subprocess.run(
            ["dpkg-deb", "-f", str(self.deb), name],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()


@pytest.fixture(scope="session")
def agent_deb(tmp_path_factory: pytest.TempPathFactory) -> Built:
    out = tmp_path_factory.mktemp("deb")
    cmd = [sys.executable, str(BUILD), "--part", "agent", "--arch", "amd64"]
    cmd += ["--version", VERSION, "--out", str(out), "--compression", "none"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, check=False)
    assert done.returncode == 0, f"{' '.join(cmd)}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    deb = out / f"edgefleet-agent_{VERSION}_amd64.deb"
    assert deb.is_file(), sorted(out.iterdir())
    control, tree = out / "DEBIAN", out / "tree"
    subprocess.run(["dpkg-deb", "-e", str(deb), str(control)], check=True, timeout=120)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True, timeout=600)
    return Built(deb=deb, control=control, tree=tree)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The first test that asks for :func:`agent_deb` waits for the build (54 s in CI, more
    than the suite's 120 s per test on a loaded machine): this folder's tests get 900 s
    (the build itself is bounded at 1500 s)."""
    for item in items:
        if item.path.parent == Path(__file__).parent:
            item.add_marker(pytest.mark.timeout(900))
