#!/usr/bin/env python3
"""Build the OCI image of one edgefleet part from its Debian package, with no base image.

    packaging/oci/build.py --part server --deb dist/edgefleet-server_0.1.0_amd64.deb

1. ``mmdebstrap --variant=apt`` makes a Debian bookworm root filesystem from Debian's
   archive with the .deb installed (apt resolves its declared dependencies) and ``tini``
   as PID 1; apt lists, caches, man pages and docs (but copyrights) are left out, device
   nodes too (the container runtime makes /dev). The output is mmdebstrap's own tarball,
   reproducible under ``SOURCE_DATE_EPOCH``, less the device nodes (:func:`filter_rootfs`).
2. ``umoci`` turns that tarball into the one layer of an OCI image and sets its config
   (entrypoint, command, user, volumes, ports, labels).
3. The OCI layout is written as one tar, ``dist/edgefleet-<part>-<version>-<arch>.oci.tar``,
   that is at once an OCI image layout (``index.json``, ``oci-layout``, ``blobs/``) and a
   docker-archive (``manifest.json`` naming the same blobs): ``docker load`` (any version)
   and ``podman load`` both take it, as they take what ``docker save`` writes since
   Docker 25. docs/adr/0013-oci-images.md says why.

Needs root (mmdebstrap installs packages as root; the layer keeps their owners) and
umoci. Debian's archive is the only network it uses. Exit 0 on success, 1 with a
one-line message on a failed step, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The Debian packages' parts and time stamp (packaging/deb/), one definition for both.
sys.path.insert(0, str(ROOT / "packaging" / "deb"))

from epoch import source_date_epoch  # noqa: E402
from parts import PARTS as DEB_PARTS  # noqa: E402
from parts import Part as DebPart  # noqa: E402

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
STEP_TIMEOUT_S = 3600
# Left out of the root filesystem: nobody reads them in a container, and they are a
# tenth of it. Copyright files stay (the licences of what the image ships).
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/lintian/*",
)


class BuildError(Exception):
    """A build step failed; the message says which and why."""


@dataclass(frozen=True)
class Part:
    """What the image adds to its Debian package's part (packaging/deb/parts.py: name,
    package, user, state and credentials directories)."""

    deb: DebPart
    command: tuple[str, ...]
    ports: tuple[str, ...]
    title: str
    description: str

    @property
    def name(self) -> str:
        return self.deb.name

    @property
    def package(self) -> str:
        return self.deb.package

    @property
    def user(self) -> str:
        return self.deb.user

    @property
    def state_dir(self) -> str:
        """The part's state directory (a volume)."""
        return self.deb.state_dir

    @property
    def credentials_dir(self) -> str:
        """Where ``setup`` writes the part's secrets (the image's CREDENTIALS_DIRECTORY)."""
        return self.deb.credentials_dir


PARTS = {
    "agent": Part(
        deb=DEB_PARTS["agent"],
        command=("edge-agent", "run", "--config", "/etc/edgefleet/agent.toml"),
        ports=("9464/tcp",),
        title="edgefleet agent",
        description="edge-agent: cameras to models to decisions on a device, with its "
        "decision log and uplink to the fleet",
    ),
    "server": Part(
        deb=DEB_PARTS["server"],
        command=("fleet-server", "serve", "--config", "/etc/edgefleet/fleet.toml"),
        ports=("8080/tcp", "8883/tcp"),
        title="edgefleet fleet server",
        description="fleet-server: enrollment, signed bundles, rollouts and ingest for a "
        "fleet of edgefleet devices, with its managed Mosquitto",
    ),
}


def run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> None:
    """Run ``cmd``; its output goes to ours.

    Raises:
        BuildError: it failed or ran past STEP_TIMEOUT_S.
    """
    print(f"+ {' '.join(cmd)}", flush=True)
    try:
        subprocess.run(cmd, check=True, timeout=STEP_TIMEOUT_S, env=env)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        raise BuildError(f"{what} failed: {exc}") from exc


def image_tag(version: str) -> str:
    """``version`` as an image tag: a Debian version's ``+``, ``~`` and ``:`` are not
    allowed in one (``[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}``) and become ``_``."""
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", version)
    return ("_" + tag if tag[0] in ".-" else tag)[:128]


def deb_field(deb: Path, field: str) -> str:
    """A control field of ``deb``.

    Raises:
        BuildError: dpkg-deb can't read it.
    """
    try:
        done = subprocess.run(
            ["dpkg-deb", "-f", str(deb), field],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        raise BuildError(f"cannot read {field} of {deb}: {exc}") from exc
    return done.stdout.strip()


def make_rootfs(deb: Path, out: Path, cache: Path, arch: str, epoch: int, mirror: str) -> None:
    """The root filesystem tarball: bookworm (variant apt), tini and ``deb`` installed.

    Downloaded .debs are kept in ``cache`` (sync-in/sync-out), so a second build takes
    nothing from the network but the package lists.

    Raises:
        BuildError: mmdebstrap or the /dev filter failed.
    """
    cache.mkdir(parents=True, exist_ok=True)
    raw = out.with_suffix(".raw.tar")
    # The .deb is bind-mounted into the chroot at its own path (file-mirror-automount),
    # whose mount point and directories stay behind: staged under /tmp, they go with
    # mmdebstrap's cleanup of /tmp instead of carrying this host's path into the image.
    with tempfile.TemporaryDirectory(prefix="edgefleet-oci-", dir="/tmp") as stage:
        staged = Path(stage) / deb.name
        try:
            os.link(deb.resolve(), staged)
        except OSError:  # another filesystem
            shutil.copyfile(deb, staged)
        _mmdebstrap(staged, raw, cache, arch, epoch, mirror)
    try:
        filter_rootfs(raw, out)
    finally:
        raw.unlink(missing_ok=True)


def _mmdebstrap(staged: Path, raw: Path, cache: Path, arch: str, epoch: int, mirror: str) -> None:
    cmd = [
        "mmdebstrap",
        "--mode=root",
        "--variant=apt",
        f"--architectures={arch}",
        "--include=tini",
        f"--include={staged}",
        "--hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount",
        "--aptopt=APT::Install-Recommends false",
        "--skip=essential/unlink",
        f'--setup-hook=mkdir -p {cache} "$1"/var/cache/apt/archives/',
        f"--setup-hook=sync-in {cache} /var/cache/apt/archives/",
        f"--customize-hook=sync-out /var/cache/apt/archives {cache}",
        # The runtime mounts these; an image must not carry the build host's.
        '--customize-hook=rm -f "$1"/etc/resolv.conf "$1"/etc/hostname',
        '--customize-hook=rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*',
        '--customize-hook=rm -f "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old',
        '--customize-hook=rm -rf "$1"/var/log/apt/* "$1"/var/log/dpkg.log',
        '--customize-hook=rm -rf "$1"/var/cache/ldconfig/aux-cache',
    ]
    cmd += [f"--dpkgopt={opt}" for opt in DPKG_EXCLUDES]
    cmd += [SUITE, str(raw), mirror]
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch))
    run(cmd, "mmdebstrap", env=env)


def filter_rootfs(raw: Path, out: Path) -> None:
    """mmdebstrap's tarball ``raw`` copied to ``out`` without the device nodes
    (``./dev/*``): the runtime makes /dev, and a rootless podman can't create them when it
    unpacks.

    Python's tarfile copies each member with its PAX records (file capabilities and other
    extended attributes kept) in order, so the result stays reproducible. GNU
    ``tar --delete``, used before, rewrote the archive in place and could leave a header
    that GNU tar and umoci then refuse ("invalid tar header").

    Raises:
        BuildError: the tarball can't be read or ``out`` written.
    """
    tmp = out.with_name(out.name + ".tmp")
    try:
        with (
            tarfile.open(raw) as src,
            tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as dst,
        ):
            for member in src:
                if member.name.startswith("./dev/") and member.name != "./dev/":
                    continue
                dst.addfile(member, src.extractfile(member) if member.isreg() else None)
        tmp.replace(out)
    except (OSError, tarfile.TarError) as exc:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"cannot filter the root filesystem {raw}: {exc}") from exc


def user_ids(rootfs_tar: Path, user: str) -> tuple[int, int]:
    """The uid and gid of ``user`` in the root filesystem's /etc/passwd.

    Raises:
        BuildError: the tarball has no /etc/passwd or it has no ``user``.
    """
    with tarfile.open(rootfs_tar) as tar:
        try:
            member = tar.extractfile("./etc/passwd")
        except KeyError:
            member = None
        if member is None:
            raise BuildError(f"{rootfs_tar} has no /etc/passwd")
        for line in member.read().decode().splitlines():
            fields = line.split(":")
            if fields[0] == user:
                return int(fields[2]), int(fields[3])
    raise BuildError(f"the package made no user {user!r} (its postinst creates it)")


def make_layout(
    part: Part, rootfs_tar: Path, layout: Path, version: str, arch: str, epoch: int
) -> str:
    """The OCI image layout in ``layout`` with one layer and the part's config.

    Returns the image's reference (``edgefleet-<part>:<version>``).

    Raises:
        BuildError: a umoci step failed, or the package made no user.
    """
    uid, gid = user_ids(rootfs_tar, part.user)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    ref = f"{part.package}:{version}"
    image = f"{layout}:{ref}"
    if layout.exists():
        shutil.rmtree(layout)
    run(["umoci", "init", "--layout", str(layout)], "umoci init")
    run(["umoci", "new", "--image", image], "umoci new")
    run(
        [
            "umoci", "raw", "add-layer", "--image", image,
            f"--history.created={created}",
            "--history.created_by=mmdebstrap --variant=apt bookworm + tini + "
            f"{part.package}_{version}_{arch}.deb",
            str(rootfs_tar),
        ],
        "umoci raw add-layer",
    )  # fmt: skip
    labels = {
        "org.opencontainers.image.title": part.title,
        "org.opencontainers.image.description": part.description,
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.base.name": f"debian:{SUITE} (mmdebstrap, no base image)",
        "org.edgefleet.user": f"{part.user} {uid}:{gid}",
    }
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "CREDENTIALS_DIRECTORY": part.credentials_dir,
    }
    cmd = ["umoci", "config", "--image", image, f"--created={created}"]
    cmd += ["--author=edgefleet", f"--architecture={arch}", "--os=linux"]
    cmd += ["--config.entrypoint=/usr/bin/tini", "--config.entrypoint=--"]
    cmd += [f"--config.cmd={arg}" for arg in part.command]
    cmd += [f"--config.user={part.user}", f"--config.workingdir={part.state_dir}"]
    cmd += ["--config.stopsignal=SIGTERM"]
    cmd += [f"--config.env={k}={v}" for k, v in env.items()]
    cmd += [f"--config.exposedports={port}" for port in part.ports]
    cmd += [f"--config.volume={v}" for v in (part.state_dir, "/etc/edgefleet")]
    cmd += [f"--config.label={k}={v}" for k, v in labels.items()]
    cmd += [f"--manifest.annotation={k}={v}" for k, v in labels.items() if "opencontainers" in k]
    cmd += [f"--history.created={created}", "--history.created_by=umoci config"]
    run(cmd, "umoci config")
    run(["umoci", "gc", "--layout", str(layout)], "umoci gc")
    return ref


def blob_path(digest: str) -> str:
    """The path of a blob inside the layout (``blobs/sha256/<hex>``)."""
    algorithm, hexdigest = digest.split(":", 1)
    return f"blobs/{algorithm}/{hexdigest}"


def add_docker_manifest(layout: Path, ref: str) -> None:
    """Name the image in ``index.json`` the way ``docker save`` does (containerd's image
    name and the OCI ref name), and add ``manifest.json``, the docker-archive index, whose
    paths are the same blobs.

    Raises:
        BuildError: the layout has not exactly one manifest.
    """
    index = json.loads((layout / "index.json").read_text())
    manifests = index.get("manifests", [])
    if len(manifests) != 1:
        raise BuildError(f"expected one manifest in {layout}/index.json, found {len(manifests)}")
    name, tag = ref.rsplit(":", 1)
    manifests[0].setdefault("annotations", {}).update(
        {
            "io.containerd.image.name": f"docker.io/library/{ref}",
            "org.opencontainers.image.ref.name": tag,
        }
    )
    (layout / "index.json").write_text(json.dumps(index, separators=(",", ":")))
    manifest = json.loads((layout / blob_path(manifests[0]["digest"])).read_text())
    docker = [
        {
            "Config": blob_path(manifest["config"]["digest"]),
            "RepoTags": [f"{name}:{tag}"],
            "Layers": [blob_path(layer["digest"]) for layer in manifest["layers"]],
        }
    ]
    (layout / "manifest.json").write_text(json.dumps(docker, separators=(",", ":")))


def write_archive(layout: Path, out: Path, epoch: int) -> None:
    """``layout`` as one tar at ``out``: names sorted, owner root, time ``epoch``.

    Raises:
        BuildError: a file could not be read or written.
    """
    tmp = out.with_name(out.name + ".tmp")
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(layout.rglob("*")):
                name = path.relative_to(layout).as_posix()
                info = tarfile.TarInfo(name)
                info.mtime = epoch
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                if path.is_dir():
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
                    continue
                info.size = path.stat().st_size
                info.mode = 0o644
                with path.open("rb") as f:
                    tar.addfile(info, f)
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"cannot write {out}: {exc}") from exc


def sha256_file(path: Path) -> str:
    """The hex sha256 of ``path``."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build(args: argparse.Namespace) -> Path:
    """Build one image; returns the archive's path.

    Raises:
        BuildError: a step failed.
    """
    part = PARTS[args.part]
    deb: Path = args.deb
    if not deb.is_file():
        raise BuildError(f"{deb} does not exist (make deb ARCHES={args.arch} builds it)")
    if deb_field(deb, "Package") != part.package:
        raise BuildError(f"{deb} is not {part.package}")
    arch = deb_field(deb, "Architecture")
    if arch != args.arch:
        raise BuildError(f"{deb} is for {arch}, not {args.arch}")
    version = image_tag(args.version or deb_field(deb, "Version"))
    if os.geteuid() != 0:
        raise BuildError("mmdebstrap installs the packages as root: run as root")
    for tool in ("mmdebstrap", "umoci", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise BuildError(f"{tool} is not installed (apt install mmdebstrap umoci)")
    epoch = source_date_epoch()
    work: Path = (args.work / part.name).resolve()
    work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rootfs = work / "rootfs.tar"
    make_rootfs(deb, rootfs, args.work.resolve() / "apt-archives", arch, epoch, args.mirror)
    rootfs_s = time.monotonic() - started
    layout = work / "layout"
    ref = make_layout(part, rootfs, layout, version, arch, epoch)
    add_docker_manifest(layout, ref)
    out: Path = args.out / f"{part.package}-{version}-{arch}.oci.tar"
    write_archive(layout, out, epoch)
    rootfs.unlink()
    total_s = time.monotonic() - started
    print(
        f"{out}: {ref}, {out.stat().st_size / 1e6:.1f} MB, sha256 {sha256_file(out)}, "
        f"built in {total_s:.0f} s (root filesystem {rootfs_s:.0f} s)",
        flush=True,
    )
    return out


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status."""
    parser = argparse.ArgumentParser(
        description="Build an edgefleet part's OCI image archive from its .deb "
        "(mmdebstrap + umoci, no base image, no registry).",
        epilog="example: packaging/oci/build.py --part server "
        "--deb dist/edgefleet-server_0.1.0_amd64.deb --out dist",
    )
    parser.add_argument("--part", choices=sorted(PARTS), required=True)
    parser.add_argument("--deb", type=Path, required=True, help="the part's .deb")
    parser.add_argument("--arch", default="amd64", help="Debian architecture (default amd64)")
    parser.add_argument("--version", help="image version (default: the .deb's)")
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="default dist/")
    parser.add_argument(
        "--work",
        type=Path,
        default=ROOT / ".cache" / "oci",
        help="work and download cache directory (default .cache/oci)",
    )
    parser.add_argument("--mirror", default=MIRROR, help=f"Debian mirror (default {MIRROR})")
    args = parser.parse_args(argv)
    try:
        build(args)
    except BuildError as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
