#!/usr/bin/env python3
"""Build edgefleet's Debian packages: a staged tree packed by ``dpkg-deb``.

    .venv/bin/python packaging/deb/build.py --part agent --arch arm64 --out dist
    .venv/bin/python packaging/deb/build.py --lock     # refresh requirements-*.txt

Writes ``<out>/edgefleet-<part>_<version>_<arch>.deb`` (version: pyproject's unless
``--version``; it is both the Debian version and the edgefleet wheel's inside, so it must
be a PEP 440 version too, e.g. ``0.1.1`` or ``0.1.0+1``). The package holds:

- /opt/edgefleet/<part>: the venv for bookworm's /usr/bin/python3 (venv.py);
- /usr/bin/<command> links into it;
- /lib/systemd/system/<unit> (and the part's other units, not enabled) from
  packaging/systemd/;
- /usr/lib/sysusers.d/<package>.conf: the system user postinst makes;
- /etc/edgefleet/<config>.example from packaging/etc/ (a conffile);
- the maintainer scripts from packaging/deb/scripts/*.in, md5sums, the copyright.

``dpkg-deb --root-owner-group`` packs it (no fakeroot; every file root's); time stamps are
clamped to ``SOURCE_DATE_EPOCH`` (the last commit's time by default). Why dpkg-deb and
not dh-virtualenv or nfpm: docs/adr/0010-debian-packages.md. Exit 0 on success, 1 with a
one-line message when a step fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the sibling modules (parts, lock, stagevenv, buildroot), also when run from elsewhere
sys.path.insert(0, str(Path(__file__).resolve().parent))

from epoch import source_date_epoch
from lock import LockError, lock
from parts import ARCHES, PARTS, PYTHON_DEPENDS, Part
from stagevenv import VenvError, stage_venv

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "packaging" / "deb"
MAINTAINER = "edgefleet maintainers <maintainers@edgefleet.invalid>"
DPKG_TIMEOUT_S = 1800
SETUP = {"agent": "edge-agent setup", "server": "fleet-server setup"}
COPYRIGHT = """\
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: edgefleet
Comment: /opt/edgefleet/{part} holds the wheels pinned in requirements-{part}.txt; each
 keeps its own licence in its *.dist-info directory there.

Files: *
License: Apache-2.0
 On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.
"""


class BuildError(Exception):
    """A build step failed; the message says which and why."""


def pyproject_version() -> str:
    found = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    if found is None:
        raise BuildError("pyproject.toml has no version")
    return found[1]


def check_version(version: str) -> None:
    """``version`` must be a Debian version without epoch or revision that is also the
    same string in PEP 440's public or local form (digits, dots, one ``+local``).

    Raises:
        BuildError: it is not.
    """
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*(\+[0-9a-z]+(\.[0-9a-z]+)*)?", version):
        raise BuildError(
            f"version {version!r}: give N.N.N or N.N.N+LOCAL (both a Debian and a PEP 440 "
            "version, e.g. 0.1.1 or 0.1.0+1)"
        )


def unit_file(part: Part) -> Path:
    """The part's systemd unit from packaging/systemd/.

    Raises:
        BuildError: it is missing.
    """
    path = ROOT / "packaging" / "systemd" / part.unit
    if not path.is_file():
        raise BuildError(f"{path.relative_to(ROOT)} is missing: the package installs it")
    return path


def sysusers(part: Part) -> str:
    """The sysusers.d(5) file that makes the part's user (and adds it to its groups)."""
    lines = [
        f"# {part.package}: the service's system user (systemd-sysusers, run by postinst)",
        f'u {part.user} - "edgefleet {part.name}" {part.state_dir} -',
    ]
    lines += [f"m {part.user} {group}" for group in part.groups]
    return "\n".join(lines) + "\n"


def maintainer_script(name: str, part: Part) -> str:
    """``packaging/deb/scripts/<name>.in`` with the part's values in.

    Raises:
        BuildError: a placeholder is left unfilled.
    """
    text = (HERE / "scripts" / f"{name}.in").read_text()
    values = {
        "PACKAGE": part.package,
        "PART": part.name,
        "UNIT": part.unit,
        "OTHER_UNITS": " ".join(part.other_units),
        "CONFIG": part.config,
        "USER": part.user,
        "PREFIX": part.prefix,
        "STATE": part.state_dir,
        "CREDENTIALS": part.credentials_dir,
        "SETUP": SETUP[part.name],
    }
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    left = re.findall(r"@[A-Z_]+@", text)
    if left:
        raise BuildError(f"scripts/{name}.in: no value for {sorted(set(left))}")
    return text


def elf_glibc_floor(site: Path) -> str:
    """The glibc the wheels need: the highest ``manylinux_2_N`` (or ``manylinux2014``,
    2.17) among their WHEEL tags."""
    floor = (2, 17)
    for wheel in site.glob("*.dist-info/WHEEL"):
        for found in re.finditer(r"manylinux_(\d+)_(\d+)_", wheel.read_text()):
            floor = max(floor, (int(found[1]), int(found[2])))
    return f"{floor[0]}.{floor[1]}"


def depends(part: Part, site: Path) -> str:
    """The Depends field: bookworm's Python, the system libraries the wheels link, the
    part's Debian packages."""
    from parts import SYSTEM_LIBS  # noqa: PLC0415

    libs = sorted(set(SYSTEM_LIBS.values()) - {"libc6"})
    items = [*PYTHON_DEPENDS, f"libc6 (>= {elf_glibc_floor(site)})", *libs, *part.depends]
    return ", ".join(items)


def control(part: Part, arch: str, version: str, site: Path, installed_kib: int) -> str:
    fields = {
        "Package": part.package,
        "Version": version,
        "Architecture": arch,
        "Maintainer": MAINTAINER,
        "Installed-Size": str(installed_kib),
        "Depends": depends(part, site),
        "Recommends": ", ".join(part.recommends),
        "Suggests": ", ".join(part.suggests),
        "Section": "misc",
        "Priority": "optional",
        "Description": f"{part.summary}\n"
        + "\n".join(f" {line}" if line else " ." for line in part.description.splitlines()),
    }
    return "".join(f"{k}: {v}\n" for k, v in fields.items() if v)


def _installed_kib(tree: Path) -> int:
    """As dpkg-gencontrol counts: each file's size rounded up to KiB, 1 for anything else."""
    total = 0
    for path in tree.rglob("*"):
        if path.is_file() and not path.is_symlink():
            total += -(-path.stat().st_size // 1024)
        else:
            total += 1
    return total


def _md5sums(tree: Path, conffiles: list[str]) -> str:
    lines = []
    for path in sorted(tree.rglob("*")):
        rel = path.relative_to(tree).as_posix()
        if rel.startswith("DEBIAN/") or path.is_symlink() or not path.is_file():
            continue
        if f"/{rel}" in conffiles:
            continue
        lines.append(f"{hashlib.md5(path.read_bytes()).hexdigest()}  {rel}\n")  # noqa: S324
    return "".join(lines)


def _clamp_times(tree: Path, epoch: int) -> None:
    for path in [tree, *tree.rglob("*")]:
        if path.lstat().st_mtime > epoch:
            os.utime(path, (epoch, epoch), follow_symlinks=False)


def stage(part: Part, arch: str, version: str, tree: Path, cache: Path) -> None:
    """Lay out the package's files and DEBIAN/ in ``tree``.

    Raises:
        BuildError: a file the package needs is missing, or the venv failed.
    """
    unit = unit_file(part)
    example = ROOT / "packaging" / "etc" / part.example
    if not example.is_file():
        raise BuildError(f"{example.relative_to(ROOT)} is missing")
    prefix = tree / part.prefix.lstrip("/")
    try:
        stage_venv(ROOT, part, arch, version, prefix, cache)
    except VenvError as exc:
        raise BuildError(str(exc)) from exc
    usr_bin = tree / "usr" / "bin"
    usr_bin.mkdir(parents=True)
    for command in part.commands:
        (usr_bin / command).symlink_to(f"{part.prefix}/bin/{command}")
    systemd = tree / "lib" / "systemd" / "system"
    systemd.mkdir(parents=True)
    shutil.copyfile(unit, systemd / part.unit)
    for other in part.other_units:
        source = ROOT / "packaging" / "systemd" / other
        if not source.is_file():
            raise BuildError(f"{source.relative_to(ROOT)} is missing")
        shutil.copyfile(source, systemd / other)
    sysusers_d = tree / "usr" / "lib" / "sysusers.d"
    sysusers_d.mkdir(parents=True)
    (sysusers_d / f"{part.package}.conf").write_text(sysusers(part))
    etc = tree / "etc" / "edgefleet"
    etc.mkdir(parents=True)
    shutil.copyfile(example, etc / part.example)
    doc = tree / "usr" / "share" / "doc" / part.package
    doc.mkdir(parents=True)
    (doc / "copyright").write_text(COPYRIGHT.format(part=part.name))

    debian = tree / "DEBIAN"
    debian.mkdir()
    conffiles = [f"/etc/edgefleet/{part.example}"]
    for name in ("postinst", "prerm", "postrm"):
        script = debian / name
        script.write_text(maintainer_script(name, part))
        script.chmod(0o755)
    (debian / "conffiles").write_text("".join(f"{c}\n" for c in conffiles))
    (debian / "md5sums").write_text(_md5sums(tree, conffiles))
    site = next(prefix.glob("lib/python*/site-packages"))
    kib = _installed_kib(tree) - _installed_kib(debian)
    (debian / "control").write_text(control(part, arch, version, site, kib))
    for path in [tree, *tree.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() or path.stat().st_mode & 0o100 else 0o644)


def build(
    part: Part, arch: str, version: str, out: Path, cache: Path, compression: str = "xz"
) -> Path:
    """Build the package (``compression``: dpkg-deb's -Z: xz, gzip or none); its path.

    Raises:
        BuildError: a step failed.
    """
    epoch = source_date_epoch()
    out.mkdir(parents=True, exist_ok=True)
    deb = out / f"{part.package}_{version}_{arch}.deb"
    with tempfile.TemporaryDirectory(prefix=f"{part.package}-", dir=cache) as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        stage(part, arch, version, tree, cache)
        _clamp_times(tree, epoch)
        partial = deb.with_suffix(".partial")
        cmd = ["dpkg-deb", "--root-owner-group", f"-Z{compression}", "--build"]
        cmd += [str(tree), str(partial)]
        print(f"+ {' '.join(cmd)}", flush=True)
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
        try:
            subprocess.run(cmd, check=True, timeout=DPKG_TIMEOUT_S, env=env)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            raise BuildError(f"dpkg-deb failed: {exc}") from exc
        partial.replace(deb)
    return deb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build edgefleet's Debian packages (or refresh their pinned requirements).",
        epilog="example: .venv/bin/python packaging/deb/build.py --part agent --arch amd64 "
        "--out dist",
    )
    parser.add_argument("--part", choices=sorted(PARTS), help="which package")
    parser.add_argument("--arch", choices=sorted(ARCHES), default="amd64", help="Debian arch")
    parser.add_argument("--version", help="package version (default: pyproject.toml's)")
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="output directory")
    parser.add_argument(
        "--cache",
        type=Path,
        default=ROOT / ".cache" / "packaging",
        help="wheel cache and scratch space (default .cache/packaging)",
    )
    parser.add_argument(
        "--compression",
        choices=("xz", "gzip", "none"),
        default="xz",
        help="of the package's data (default xz; the tests use none, faster to build)",
    )
    parser.add_argument(
        "--lock",
        action="store_true",
        help="write packaging/deb/requirements-<part>.txt from the running environment's "
        "versions (both parts, or --part), with the wheels' hashes for every arch",
    )
    args = parser.parse_args(argv)
    try:
        if args.lock:
            for name in [args.part] if args.part else sorted(PARTS):
                part = PARTS[name]
                lock(ROOT, part, HERE / part.requirements)
                print(f"wrote {HERE / part.requirements}")
            return 0
        if args.part is None:
            parser.error("--part is required (or --lock)")
        version = args.version or pyproject_version()
        check_version(version)
        args.cache.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        cache = args.cache.resolve()
        deb = build(PARTS[args.part], args.arch, version, args.out, cache, args.compression)
    except (BuildError, LockError) as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 1
    size = deb.stat().st_size / 2**20
    print(f"{deb} ({size:.1f} MiB, {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
