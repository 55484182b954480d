"""A Debian bookworm root filesystem of the target arch, for what pip can't download.

Some pinned distributions have no wheel for an arch on PyPI (hdrhistogram has none for
aarch64); their source archive, hash-checked against the lock, is compiled into a wheel by
bookworm's own Python 3.11 and gcc of that arch, in a root filesystem made by
``mmdebstrap --arch`` and entered with ``systemd-nspawn`` (foreign arches run through
qemu-user-static and binfmt_misc). The same root filesystem runs the staged venv's
commands as the target would (the tests' import check).

Needs root, mmdebstrap, systemd-nspawn and, for a foreign arch, qemu-user-static with its
binfmt_misc handler registered.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from parts import ARCHES

SUITE = "bookworm"
PACKAGES = ("python3", "python3-dev", "python3-pip", "python3-setuptools", "python3-wheel")
BUILD_PACKAGES = ("python3-pbr", "gcc", "libc6-dev")
"""Build back ends the sdists in the locks use (hdrhistogram: pbr), from Debian."""
MMDEBSTRAP_TIMEOUT_S = 1800
RUN_TIMEOUT_S = 1800


class BuildRootError(Exception):
    """The root filesystem can't be made or a command in it failed."""


def host_arch() -> str:
    """The build machine's Debian arch name."""
    machine = platform.machine()
    for arch, name in ARCHES.items():
        if name == machine:
            return arch
    return machine


def _check_tools(arch: str) -> None:
    """Raises:
    BuildRootError: a tool is missing, or the arch can't run here.
    """
    for tool in ("mmdebstrap", "systemd-nspawn"):
        if shutil.which(tool) is None:
            raise BuildRootError(f"{tool} is not installed (make deb installs it)")
    if arch != host_arch():
        handler = Path("/proc/sys/fs/binfmt_misc") / f"qemu-{ARCHES[arch]}"
        if not handler.exists():
            raise BuildRootError(
                f"{arch} programs can't run here: no {handler} (install qemu-user-static "
                "and binfmt-support; make deb does)"
            )


def tarball(cache: Path, arch: str) -> Path:
    """The cached root filesystem tarball for ``arch``, made on first use.

    Raises:
        BuildRootError: a tool is missing or mmdebstrap failed.
    """
    _check_tools(arch)
    path = cache / f"buildroot-{SUITE}-{arch}.tar"
    if path.is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.tar")
    cmd = ["mmdebstrap", "--variant=apt", f"--arch={arch}", "--mode=root"]
    cmd += ["--include=" + ",".join(PACKAGES + BUILD_PACKAGES), SUITE, str(partial)]
    print(f"+ {' '.join(cmd)}", flush=True)
    try:
        subprocess.run(cmd, check=True, timeout=MMDEBSTRAP_TIMEOUT_S)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        raise BuildRootError(f"mmdebstrap for {arch} failed: {exc}") from exc
    partial.replace(path)
    return path


def run_in(
    cache: Path, arch: str, cmd: Sequence[str], binds: dict[Path, str]
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in a fresh copy of ``arch``'s root filesystem with ``binds`` (host
    path -> path inside) mounted; its output captured.

    Raises:
        BuildRootError: the root filesystem can't be made or nspawn can't start.
    """
    source = tarball(cache, arch)
    with tempfile.TemporaryDirectory(prefix=f"buildroot-{arch}-", dir=cache) as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        subprocess.run(["tar", "-xf", str(source), "-C", str(root)], check=True, timeout=600)
        full = ["systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "--pipe"]
        full += ["--private-network", "-D", str(root)]
        full += [f"--bind={host}:{inside}" for host, inside in binds.items()]
        full += ["--setenv=PIP_CONFIG_FILE=/dev/null", "--setenv=LANG=C.UTF-8", *cmd]
        print(f"+ {' '.join(full)}", flush=True)
        try:
            return subprocess.run(
                full,
                stdin=subprocess.DEVNULL,  # --pipe: a command reading stdin must see EOF
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT_S,
                check=False,
            )
        except (subprocess.TimeoutExpired, OSError) as exc:
            raise BuildRootError(f"systemd-nspawn ({arch}) failed: {exc}") from exc


def build_wheel(cache: Path, arch: str, sdist: Path, out: Path) -> Path:
    """Compile ``sdist`` into a wheel for ``arch`` (bookworm's Python 3.11) in ``out``.

    Raises:
        BuildRootError: the build failed or made no wheel.
    """
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.whl"))
    with tempfile.TemporaryDirectory(prefix="sdist-", dir=cache) as tmp:
        shutil.copy2(sdist, Path(tmp) / sdist.name)
        cmd = ["python3", "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
        cmd += ["--no-index", "--wheel-dir", "/out", f"/src/{sdist.name}"]
        done = run_in(cache, arch, cmd, {Path(tmp): "/src", out: "/out"})
    made = sorted(set(out.glob("*.whl")) - before)
    if done.returncode != 0 or len(made) != 1:
        raise BuildRootError(
            f"building {sdist.name} for {arch} failed ({done.returncode}):\n"
            f"{done.stdout[-1500:]}{done.stderr[-1500:]}"
        )
    return made[0]
