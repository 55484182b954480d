"""tests/conftest.py's SLOW_FILES_FIRST names test files that exist, each once: a file
renamed or removed would otherwise drop silently to its collection order."""

from __future__ import annotations

from tests.conftest import REPO, SLOW_FILES_FIRST


def test_every_slow_file_listed_exists_once() -> None:
    missing = [name for name in SLOW_FILES_FIRST if not (REPO / name).is_file()]
    assert not missing, f"not test files: {missing}"
    assert len(set(SLOW_FILES_FIRST)) == len(SLOW_FILES_FIRST)
    assert all(name.startswith("tests/") and name.endswith(".py") for name in SLOW_FILES_FIRST)
