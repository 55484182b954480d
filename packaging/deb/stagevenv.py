"""Stage a part's virtualenv for bookworm's /usr/bin/python3 on any Debian arch.

The venv is laid out by hand as ``python3 -m venv`` lays it out on bookworm, so that the
build machine's Python and arch do not matter: ``pyvenv.cfg`` with ``home = /usr/bin``,
``bin/python3 -> /usr/bin/python3``, ``lib/python3.11/site-packages``. pip fills
site-packages for the target platform (``--platform``/``--python-version``/``--abi``
with binary wheels only), from the hash-pinned requirements, through a wheel cache per
arch (``.cache/packaging/wheels/<arch>``: the second build is offline). The edgefleet
wheel is built from the checkout with the package's version. The part's commands are
small scripts with ``#!/opt/edgefleet/<part>/bin/python``, every module is compiled to
unchecked-hash .pyc files with the installed path as their file name, and the first-party
packages the part does not run (hil; fleet_server in the agent) are left out.
"""

from __future__ import annotations

import contextlib
import fcntl
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from buildroot import BuildRootError, build_wheel
from lock import canonical, pip_env, platform_args
from parts import PYTHON_VERSION, Part

PIP_TIMEOUT_S = 1800
COMPILE_TIMEOUT_S = 900
FIRST_PARTY_DIRS = ("agent", "runtime", "fleet_server", "firmware_profiles", "hil")
WHEEL_SOURCES = ("pyproject.toml", "README.md", *FIRST_PARTY_DIRS)


class VenvError(Exception):
    """A step of staging the venv failed; the message says which and why."""


def run(cmd: list[str], what: str, timeout_s: float = PIP_TIMEOUT_S) -> None:
    """Run ``cmd``; its output goes to ours.

    Raises:
        VenvError: it failed or ran past ``timeout_s``.
    """
    print(f"+ {' '.join(cmd)}", flush=True)
    try:
        subprocess.run(cmd, check=True, timeout=timeout_s, env=pip_env())
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        raise VenvError(f"{what} failed: {exc}") from exc


def site_packages(prefix: Path) -> Path:
    return prefix / "lib" / f"python{PYTHON_VERSION}" / "site-packages"


def _dist_of(filename: str) -> tuple[str, str] | None:
    """``(canonical name, version)`` of a wheel or source archive file name."""
    found = re.match(r"^(.+?)-(\d[^-]*?)(?:\.tar\.gz|\.zip|-.+\.whl)$", filename)
    if found is None:
        return None
    return canonical(found[1]), found[2]


def _pins(requirements: Path) -> dict[tuple[str, str], str]:
    """``(canonical name, version) -> line`` of a hash-pinned requirements file."""
    pins = {}
    for line in requirements.read_text().splitlines():
        found = re.match(r"^([A-Za-z0-9._-]+)==(\S+)\s", line)
        if found:
            pins[canonical(found[1]), found[2]] = line
    return pins


def _cached(folder: Path, suffix: str) -> dict[tuple[str, str], Path]:
    found = {}
    for path in folder.glob(f"*{suffix}") if folder.is_dir() else ():
        dist = _dist_of(path.name)
        if dist is not None:
            found[dist] = path
    return found


def install_requirements(
    requirements: Path, arch: str, site: Path, wheels: Path, cache: Path
) -> None:
    """Install the pinned, hashed ``requirements`` for ``arch`` into ``site``.

    Files come from the wheel cache ``wheels`` (one per arch); what it lacks is
    downloaded into it first (checked against the hashes). A distribution with no wheel
    for the arch comes as its hash-checked source archive and is compiled for the arch
    (buildroot.py) into ``wheels/built/``, installed from there; the rest is installed
    with ``--require-hashes``. A warm cache needs no network.

    Raises:
        VenvError: pip failed (a hash mismatch, nothing for the platform), or a build.
    """
    pins = _pins(requirements)
    built_dir = wheels / "built"
    with _locked(wheels):
        _fill_cache(requirements, arch, pins, wheels, built_dir, cache)
        _install(arch, pins, site, wheels, built_dir)


@contextlib.contextmanager
def _locked(wheels: Path) -> Iterator[None]:
    """The wheel cache ``wheels`` held by this build alone: two builds at once (make
    test's package checks beside make package-test, as CI runs them) would otherwise
    install from a wheel the other is still downloading into it."""
    wheels.mkdir(parents=True, exist_ok=True)
    with (wheels / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _fill_cache(
    requirements: Path,
    arch: str,
    pins: dict[tuple[str, str], str],
    wheels: Path,
    built_dir: Path,
    cache: Path,
) -> None:
    """Download into ``wheels`` what it lacks of ``pins``; build what has no wheel."""
    have = _cached(wheels, ".whl") | _cached(built_dir, ".whl")
    if set(pins) - set(have):
        cmd = [sys.executable, "-m", "pip", "download", "--dest", str(wheels), "--quiet"]
        cmd += ["--no-deps", "--require-hashes", "--prefer-binary", *platform_args(arch)]
        run([*cmd, "-r", str(requirements)], f"pip download for {arch}")
        sdists = _cached(wheels, ".tar.gz") | _cached(wheels, ".zip")
        for dist in sorted(
            set(pins) - set(_cached(wheels, ".whl")) - set(_cached(built_dir, ".whl"))
        ):
            if dist not in sdists:
                raise VenvError(f"{dist[0]}=={dist[1]}: neither a wheel nor a source archive")
            try:
                build_wheel(cache, arch, sdists[dist], built_dir)
            except BuildRootError as exc:
                raise VenvError(str(exc)) from exc


def _install(
    arch: str,
    pins: dict[tuple[str, str], str],
    site: Path,
    wheels: Path,
    built_dir: Path,
) -> None:
    """Install ``pins`` into ``site`` from the filled cache, hash-checked."""
    built = _cached(built_dir, ".whl")
    with tempfile.TemporaryDirectory(prefix="edgefleet-req-") as tmp:
        hashed = Path(tmp) / "requirements.txt"
        hashed.write_text("".join(f"{line}\n" for d, line in pins.items() if d not in built))
        common = ["--no-deps", "--no-compile", "--no-index", "--quiet", *platform_args(arch)]
        install = [sys.executable, "-m", "pip", "install", "--target", str(site), *common]
        run(
            [*install, "--find-links", str(wheels), "--require-hashes", "-r", str(hashed)],
            f"pip install for {arch}",
        )
    mine = [built[d] for d in pins if d in built]
    if mine:
        # compiled here from a source archive whose hash the lock pins
        run([*install, "--upgrade", *map(str, mine)], f"pip install of the wheels built for {arch}")


def build_edgefleet_wheel(root: Path, version: str, out: Path) -> Path:
    """The edgefleet wheel of the checkout at ``root``, its version set to ``version``.

    Raises:
        VenvError: the version is not one pip accepts, or the build failed.
    """
    with tempfile.TemporaryDirectory(prefix="edgefleet-src-") as tmp:
        src = Path(tmp)
        for name in WHEEL_SOURCES:
            path = root / name
            if path.is_dir():
                shutil.copytree(
                    path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
                )
            else:
                shutil.copy2(path, src / name)
        pyproject = src / "pyproject.toml"
        text, count = re.subn(
            r'^version = "[^"]*"$', f'version = "{version}"', pyproject.read_text(), flags=re.M
        )
        if count != 1:
            raise VenvError(f"{root / 'pyproject.toml'}: no single `version = ...` line")
        pyproject.write_text(text)
        out.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
        cmd += ["--disable-pip-version-check", "--quiet", "--wheel-dir", str(out), str(src)]
        run(cmd, "building the edgefleet wheel")
    wheels = sorted(out.glob("edgefleet-*.whl"))
    if len(wheels) != 1:
        raise VenvError(f"expected one edgefleet wheel in {out}, found {wheels}")
    return wheels[0]


def _drop_direct_urls(site: Path) -> None:
    """Remove PEP 610's direct_url.json (the build machine's path of a local wheel) and
    its RECORD line: what pip installed from a file here is not installed from a URL."""
    for found in site.glob("*.dist-info/direct_url.json"):
        found.unlink()
        record = found.parent / "RECORD"
        rel = f"{found.parent.name}/{found.name},"
        lines = record.read_text().splitlines(keepends=True)
        record.write_text("".join(ln for ln in lines if not ln.startswith(rel)))


def _drop_first_party(site: Path, keep: set[str]) -> None:
    """Remove the first-party packages not in ``keep`` and their lines in RECORD."""
    dropped = [name for name in FIRST_PARTY_DIRS if name not in keep]
    for name in dropped:
        shutil.rmtree(site / name, ignore_errors=True)
    for record in site.glob("edgefleet-*.dist-info/RECORD"):
        lines = record.read_text().splitlines(keepends=True)
        kept = [ln for ln in lines if ln.split("/", 1)[0] not in dropped]
        record.write_text("".join(kept))


def _write_layout(prefix: Path) -> None:
    """pyvenv.cfg and the interpreter links, as bookworm's ``python3 -m venv`` makes them."""
    (prefix / "pyvenv.cfg").write_text(
        "home = /usr/bin\n"
        "include-system-site-packages = false\n"
        f"version = {PYTHON_VERSION}\n"
        f"executable = /usr/bin/python{PYTHON_VERSION}\n"
    )
    bindir = prefix / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    (bindir / "python3").symlink_to("/usr/bin/python3")
    (bindir / "python").symlink_to("python3")
    (bindir / f"python{PYTHON_VERSION}").symlink_to("python3")
    (prefix / "lib64").symlink_to("lib")


def console_script(part: Part, command: str) -> str:
    """The text of ``command``'s script in ``part``'s venv."""
    module, _, func = part.commands[command].partition(":")
    return (
        f"#!{part.prefix}/bin/python\n"
        f'"""{command}: a command of {part.package} (written by packaging/deb/build.py)."""\n'
        "import sys\n\n"
        "# every module is shipped compiled; nothing may write beside the package's files\n"
        "sys.dont_write_bytecode = True\n"
        f"from {module} import {func}\n\n"
        'if __name__ == "__main__":\n'
        f"    sys.exit({func}())\n"
    )


def _compile(site: Path, prefix: Path, installed: str) -> None:
    """Byte-compile site-packages for Python 3.11 with the installed paths in the code
    objects; unchecked-hash .pyc files do not depend on the files' mtimes.

    Raises:
        VenvError: no Python 3.11 to compile with.
    """
    python = sys.executable if sys.version_info[:2] == (3, 11) else shutil.which("python3.11")
    if python is None:
        raise VenvError("byte-compiling for bookworm needs a Python 3.11 (run with .venv/bin)")
    cmd = [python, "-m", "compileall", "-q", "-j", "2", "--invalidation-mode", "unchecked-hash"]
    cmd += ["-s", str(prefix), "-p", installed, str(site)]
    print(f"+ {' '.join(cmd)}", flush=True)
    try:
        # A few wheels ship test files for other Python versions that do not compile;
        # those stay uncompiled (and are never imported), so the exit status is not used.
        subprocess.run(cmd, timeout=COMPILE_TIMEOUT_S, check=False, stdout=subprocess.DEVNULL)
    except (subprocess.TimeoutExpired, OSError) as exc:
        raise VenvError(f"byte-compiling failed: {exc}") from exc


def normalize_modes(tree: Path) -> None:
    """Directories 0755, files 0644 (0755 when executable by the owner); links kept."""
    for path in [tree, *tree.rglob("*")]:
        if path.is_symlink():
            continue
        if path.is_dir():
            path.chmod(0o755)
        else:
            path.chmod(0o755 if path.stat().st_mode & 0o100 else 0o644)


def stage_venv(root: Path, part: Part, arch: str, version: str, prefix: Path, cache: Path) -> None:
    """Make ``part``'s venv for ``arch`` in ``prefix`` (the staged /opt/edgefleet/<part>).

    Raises:
        VenvError: a step failed.
    """
    requirements = root / "packaging" / "deb" / part.requirements
    if not requirements.is_file():
        raise VenvError(f"{requirements} is missing: run packaging/deb/build.py --lock")
    site = site_packages(prefix)
    install_requirements(requirements, arch, site, cache / "wheels" / arch, cache)
    shutil.rmtree(site / "bin", ignore_errors=True)  # dependencies' scripts, wrong shebangs
    with tempfile.TemporaryDirectory(prefix="edgefleet-wheel-") as tmp:
        wheel = build_edgefleet_wheel(root, version, Path(tmp))
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet"]
        cmd += ["--no-compile", "--disable-pip-version-check", "--target", str(site)]
        run([*cmd, str(wheel)], "installing the edgefleet wheel")
    shutil.rmtree(site / "bin", ignore_errors=True)  # edgefleet's, written anew below
    keep = set(part.roots) | {"agent", "runtime", "firmware_profiles"}
    _drop_first_party(site, keep)
    _drop_direct_urls(site)
    _write_layout(prefix)
    for command in part.commands:
        script = prefix / "bin" / command
        script.write_text(console_script(part, command))
        script.chmod(0o755)
    _compile(site, prefix, part.prefix)
    normalize_modes(prefix)
