"""The pinned requirements of each part: ``build.py --lock`` writes them.

1. Which distributions a part imports: every ``import`` statement (module level or in a
   function) of every module the part can reach, found by reading the sources (no code
   runs), starting from all modules of the part's root packages and following
   first-party imports; top-level names are mapped to the distributions that provide them
   in the running environment (the project's .venv).
2. The closure, with versions: ``pip install --dry-run --report`` for the target platform
   (bookworm's CPython 3.11 on the Debian arch), with those distributions pinned to the
   versions installed in the running environment and everything else constrained to it,
   so the packages carry what the tests ran against.
3. One line per distribution, ``name==version --hash=sha256:...`` with the hash of the
   file pip chose for each architecture.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from parts import ARCHES, GLIBC_MINOR, PYTHON_VERSION, Part

PIP_TIMEOUT_S = 900
FIRST_PARTY = ("agent", "runtime", "fleet_server", "firmware_profiles", "hil")
NOT_FROM_PYPI = {
    # imported under a guard for other systems, never on bookworm's Python 3.11
    "tflite_runtime",  # LiteRT's older name, for devices held to NumPy 1
    "tomli",  # tomllib before Python 3.11
}


class LockError(Exception):
    """The lock could not be made; the message says why."""


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pip_env() -> dict[str, str]:
    """The environment for every pip the build runs: no pip configuration of this
    machine (extra indexes, find-links, constraints) leaks into what the packages hold;
    PyPI (or ``PIP_INDEX_URL``) is the one source."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    for keep in ("PIP_INDEX_URL", "PIP_CERT", "PIP_DEFAULT_TIMEOUT"):
        if keep in os.environ:
            env[keep] = os.environ[keep]
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _all_modules(root: Path, package: str) -> list[str]:
    found = []
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found.append(".".join(parts))
    return found


def _imports_of(path: Path, module: str) -> Iterable[str]:
    """Every module name ``path`` imports (absolute, dotted; ``from a import b`` gives both
    ``a`` and ``a.b``)."""
    tree = ast.parse(path.read_bytes(), str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, node.module] if node.module else anchor)
            else:
                base = node.module or ""
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def imported_top_levels(root: Path, part: Part) -> set[str]:
    """The third-party top-level module names ``part`` imports anywhere in its reach.

    Raises:
        LockError: a source file does not parse.
    """
    todo = [m for package in part.roots for m in _all_modules(root, package)]
    seen: set[str] = set()
    third: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _module_file(root, module)
        if path is None:
            continue
        try:
            names = list(_imports_of(path, module))
        except SyntaxError as exc:
            raise LockError(f"{path}: {exc}") from exc
        for name in names:
            top = name.split(".")[0]
            if top in FIRST_PARTY:
                if _module_file(root, name) is not None:
                    todo.append(name)
            elif top and top not in sys.stdlib_module_names and top != "__future__":
                third.add(top)
    return third - NOT_FROM_PYPI


def distributions_for(top_levels: set[str]) -> dict[str, str]:
    """``canonical name -> installed version`` of the distributions providing ``top_levels``
    in the running environment.

    Raises:
        LockError: a name is provided by no installed distribution.
    """
    providers = importlib.metadata.packages_distributions()
    found: dict[str, str] = {}
    missing = []
    for top in sorted(top_levels):
        dists = providers.get(top)
        if not dists:
            missing.append(top)
            continue
        for dist in dists:
            found[canonical(dist)] = importlib.metadata.version(dist)
    if missing:
        raise LockError(
            f"imported but installed by no distribution here: {', '.join(missing)} "
            "(run the lock with the project's .venv python)"
        )
    return found


def platform_args(arch: str) -> list[str]:
    """pip's options for files that run on bookworm's CPython 3.11 on ``arch`` (add
    ``--only-binary=:all:`` unless ``--no-deps`` is given: pip's rule)."""
    machine = ARCHES[arch]
    args = ["--implementation", "cp"]
    args += ["--python-version", PYTHON_VERSION, "--abi", "cp" + PYTHON_VERSION.replace(".", "")]
    args += ["--platform", f"manylinux2014_{machine}"]
    for minor in range(GLIBC_MINOR, 16, -1):
        args += ["--platform", f"manylinux_2_{minor}_{machine}"]
    # what buildroot.py compiles on bookworm itself (PyPI takes no such wheel)
    return [*args, "--platform", f"linux_{machine}"]


def _installed_constraints() -> str:
    lines = []
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and canonical(name) != "edgefleet":
            lines.append(f"{canonical(name)}=={dist.version}")
    return "\n".join(sorted(set(lines))) + "\n"


def resolve(
    wanted: dict[str, str], arch: str, extras: dict[str, str], closed: bool
) -> dict[str, tuple[str, str]]:
    """``canonical name -> (version, sha256 of the chosen file)`` for ``arch``.

    With ``closed`` false: pip's resolution of ``wanted`` (pinned, with ``extras``: name ->
    ``[extra,...]``) for the target, binary wheels only, constrained to what is installed.
    With ``closed`` true, ``wanted`` is already the whole closure: each is looked up
    alone (``--no-deps``), a wheel where the arch has one, else the source archive, which
    the build then compiles for the arch (stagevenv.py).

    Raises:
        LockError: pip failed or its report is not what it documents.
    """
    with tempfile.TemporaryDirectory(prefix="edgefleet-lock-") as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(_installed_constraints())
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
        cmd += ["--quiet", "--report", str(report), "--target", str(Path(tmp) / "t")]
        cmd += ["-c", str(constraints), *platform_args(arch)]
        cmd += ["--no-deps", "--prefer-binary"] if closed else ["--only-binary=:all:"]
        cmd += [f"{n}{extras.get(n, '')}=={v}" for n, v in sorted(wanted.items())]
        try:
            subprocess.run(cmd, check=True, timeout=PIP_TIMEOUT_S, env=pip_env())
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            raise LockError(f"pip could not resolve the {arch} closure: {exc}") from exc
        data = json.loads(report.read_text())
    out: dict[str, tuple[str, str]] = {}
    try:
        for item in data["install"]:
            meta = item["metadata"]
            digest = item["download_info"]["archive_info"]["hashes"]["sha256"]
            out[canonical(meta["name"])] = (meta["version"], digest)
    except (KeyError, TypeError) as exc:
        raise LockError(f"pip's report lacks {exc}") from exc
    return out


def lock_text(part: Part, by_arch: dict[str, dict[str, tuple[str, str]]], roots: set[str]) -> str:
    """The requirements file: the same versions on every arch, each file's hash.

    Raises:
        LockError: the arches resolved to different versions.
    """
    names = sorted(set().union(*(set(r) for r in by_arch.values())))
    lines = [
        f"# {part.package}: every distribution its venv holds, pinned, with the sha256 of",
        "# the wheel for each architecture. Generated by `packaging/deb/build.py --lock`",
        "# from the versions in the project's .venv; do not edit by hand.",
        f"# imported by the part: {', '.join(sorted(roots))}",
    ]
    for name in names:
        versions = {r[name][0] for r in by_arch.values() if name in r}
        if len(versions) != 1 or any(name not in r for r in by_arch.values()):
            raise LockError(f"{name}: the arches resolve differently ({by_arch})")
        hashes = sorted({r[name][1] for r in by_arch.values()})
        pins = " ".join(f"--hash=sha256:{h}" for h in hashes)
        lines.append(f"{name}=={versions.pop()} {pins}")
    return "\n".join(lines) + "\n"


def lock(root: Path, part: Part, out: Path) -> None:
    """Write ``part``'s requirements file to ``out``.

    Raises:
        LockError: as :func:`imported_top_levels`, :func:`distributions_for`,
            :func:`resolve` and :func:`lock_text`.
    """
    wanted = distributions_for(imported_top_levels(root, part))
    extras: dict[str, str] = {}
    for spec in part.also:
        name, _, extra = spec.partition("[")
        wanted[canonical(name)] = importlib.metadata.version(name)
        extras[canonical(name)] = f"[{extra}" if extra else ""
    first, *others = ARCHES
    by_arch = {first: resolve(wanted, first, extras, closed=False)}
    # the closure is the same on every arch (no dependency here has an arch marker)
    closure = {name: version for name, (version, _) in by_arch[first].items()}
    for arch in others:
        by_arch[arch] = resolve(closure, arch, {}, closed=True)
    out.write_text(lock_text(part, by_arch, set(wanted)))
