"""The project's dependency floors (``pyproject.toml``) exclude the versions known to be
unsafe for it, and the Debian packages' pins (``packaging/deb/requirements-*.txt``) lie
within them: a source install and a .deb get the same guarantees."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from agent.kernel.toml import parse_toml

ROOT = Path(__file__).resolve().parents[1]

KNOWN_BAD = {
    # python-tuf <= 7.0.0 reuses a delegated role cached through one delegator when the
    # same role is reached through another (fixed in 7.0.1).
    "tuf": ["6.0.0", "7.0.0"],
}


def _requirements() -> dict[str, Requirement]:
    path = ROOT / "pyproject.toml"
    data = parse_toml(path.read_text(encoding="utf-8"), str(path))
    reqs = [Requirement(r) for r in data["project"]["dependencies"]]
    return {canonicalize_name(r.name): r for r in reqs}


@pytest.mark.parametrize(("name", "versions"), sorted(KNOWN_BAD.items()))
def test_a_known_bad_version_does_not_satisfy_the_projects_requirement(
    name: str, versions: list[str]
) -> None:
    req = _requirements()[name]
    allowed = [v for v in versions if req.specifier.contains(v, prereleases=True)]
    assert allowed == [], f"pyproject.toml's {req} allows {allowed}"


@pytest.mark.parametrize("lock", sorted((ROOT / "packaging" / "deb").glob("requirements-*.txt")))
def test_every_debian_pin_of_a_project_dependency_satisfies_its_requirement(lock: Path) -> None:
    reqs = _requirements()
    checked = 0
    for line in lock.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        pin = Requirement(line.split(" --hash", 1)[0])
        req = reqs.get(canonicalize_name(pin.name))
        if req is None or (req.marker is not None and not req.marker.evaluate()):
            continue
        version = next(iter(pin.specifier)).version
        assert req.specifier.contains(version, prereleases=True), f"{lock.name}: {pin} vs {req}"
        checked += 1
    assert checked > 0, f"{lock.name} pins none of the project's dependencies"
