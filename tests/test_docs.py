"""The documentation can't rot: its examples run, its references are current.

- Every ```python block in README.md and docs/**/*.md runs, each in a fresh temporary
  directory as its working directory (``python -c``, the checkout on ``PYTHONPATH``).
  Conventions, for the writer of a page:

  - A block that needs setup has an HTML comment on the line before its opening fence:
    ``<!-- docs-test: setup=models -->`` links this checkout's ``.cache/models`` (the
    pretrained models of ``make models``) into the directory first. Setups are listed in
    ``SETUPS`` below.
  - A block whose every ``print(...)`` line ends in a comment ``# VALUE`` must print those
    values, one line each, in order; after ``VALUE``, a ``:`` starts a remark
    (``print(n)  # 0: stored once``).
  - An illustrative fragment that is not a program is fenced as ```text, not ```python.

- docs/cli.md is what ``scripts/cli_reference.py`` writes from the ``--help`` of every
  command of ``[project.scripts]``.
- docs/adr/index.md lists every ADR in docs/adr/.
- Links in README.md and docs/ stay inside the repository and name files that exist.
- README.md's Layout section names every top-level directory of the repository, and
  every path it names exists.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import cli_reference  # noqa: E402

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(
    r"(?:<!--\s*docs-test:\s*(?P<options>[^>]*?)\s*-->\n)?^```python\n(?P<code>.*?)^```",
    flags=re.DOTALL | re.MULTILINE,
)


def _link_models(cwd: Path) -> None:
    models = ROOT / ".cache" / "models"
    if not models.is_dir():
        pytest.fail(f"{models} is missing: run `make models` to fetch the pretrained models")
    (cwd / ".cache").mkdir()
    (cwd / ".cache" / "models").symlink_to(models)


SETUPS: dict[str, Callable[[Path], None]] = {"models": _link_models}


def _blocks() -> list[tuple[str, str, dict[str, str]]]:
    """``(id, code, options)`` of every python block, id ``page:line``."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start("code"))
            options = dict(
                item.split("=", 1) for item in (match.group("options") or "").split() if item
            )
            found.append((f"{page.relative_to(ROOT)}:{line}", match.group("code"), options))
    return found


BLOCKS = _blocks()


def _expected_output(code: str) -> list[str] | None:
    """What the block says it prints, when every ``print(`` line says so (else None)."""
    prints = [line for line in code.splitlines() if line.lstrip().startswith("print(")]
    said = [re.search(r"\)\s+#\s(.+)$", line) for line in prints]
    if not prints or not all(said):
        return None
    return [m.group(1).split(": ", 1)[0].strip() for m in said if m]


def test_the_docs_have_python_examples() -> None:
    assert len(BLOCKS) >= 2, [b[0] for b in BLOCKS]
    assert any(block_id.startswith("README.md") for block_id, _, _ in BLOCKS)


@pytest.mark.parametrize(("block_id", "code", "options"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_python_block_runs(
    block_id: str, code: str, options: dict[str, str], tmp_path: Path
) -> None:
    unknown = set(options) - {"setup"}
    assert not unknown, f"{block_id}: unknown docs-test option(s) {sorted(unknown)}"
    for name in filter(None, options.get("setup", "").split(",")):
        assert name in SETUPS, f"{block_id}: unknown setup {name!r} (known: {sorted(SETUPS)})"
        SETUPS[name](tmp_path)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    # `python -c`: spawned worker processes don't re-run a __main__ that has no file.
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{block_id} failed:\n{proc.stdout}\n{proc.stderr}"
    expected = _expected_output(code)
    if expected is not None:
        got = proc.stdout.strip().splitlines()
        assert got == expected, f"{block_id} printed {got}, its comments say {expected}"


def test_cli_reference_is_current() -> None:
    current = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    if current != cli_reference.render():
        pytest.fail("docs/cli.md is stale: run python scripts/cli_reference.py")


def test_cli_reference_covers_every_console_command() -> None:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for name in cli_reference.console_scripts():
        assert f"\n## {name}\n" in text, f"docs/cli.md has no section for {name}"


def test_every_adr_is_in_the_index() -> None:
    adr_dir = ROOT / "docs" / "adr"
    index = (adr_dir / "index.md").read_text(encoding="utf-8")
    records = sorted(p.name for p in adr_dir.glob("[0-9][0-9][0-9][0-9]-*.md"))
    assert records, "docs/adr/ holds no ADR"
    missing = [name for name in records if f"]({name})" not in index]
    assert not missing, f"docs/adr/index.md does not list {missing}"
    for name in records:
        number = name[:4]
        (row,) = [line for line in index.splitlines() if f"]({name})" in line]
        assert row.startswith(f"| [{number}]"), f"docs/adr/index.md: {name} listed as {row!r}"


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_links_stay_inside_the_repository_and_exist(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the same page
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            bad.append(target)
    assert "../shared" not in text
    assert not bad, f"{page.relative_to(ROOT)} links outside the repository or to nothing: {bad}"


def _layout_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", text, flags=re.DOTALL | re.MULTILINE)
    assert section, "README.md has no '## Layout' section"
    block = re.search(r"^```(?:text)?\n(.*?)^```", section.group(1), flags=re.DOTALL | re.M)
    assert block, "README.md's Layout section has no code block"
    return block.group(1)


SUBDIRS_NAMED = ("runtime", "agent", "fleet_server", "hil", "tests", "docs")


def test_readme_layout_matches_the_tree() -> None:
    layout = _layout_block()
    named = re.findall(r"^ {0,2}([\w./-]+/?)(?=\s|$)", layout, flags=re.MULTILINE)
    paths = [n for n in named if "/" in n or "." in n]
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"README.md's Layout names what does not exist: {missing}"
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    top_dirs = sorted({p.split("/", 1)[0] for p in tracked if "/" in p and not p.startswith(".")})
    top_dirs = [d for d in top_dirs if (ROOT / d).is_dir()]
    left_out = [d for d in top_dirs if f"{d}/" not in paths]
    assert not left_out, f"README.md's Layout leaves out {left_out}"
    # ... and every package's (and docs/, tests/) folders one level down.
    sub_dirs = sorted(
        {
            "/".join(p.split("/")[:2])
            for p in tracked
            if p.count("/") >= 2 and p.split("/")[0] in SUBDIRS_NAMED
        }
    )
    left_out = [d for d in sub_dirs if f"{d}/" not in paths]
    assert not left_out, f"README.md's Layout leaves out {left_out}"
