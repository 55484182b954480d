"""The OCI archives ``make image`` writes (built here from the session's .debs): valid
OCI and docker-archive indexes whose every blob matches its digest, a config that runs
the part in the foreground as its user, a layer that holds the part's virtualenv, and
the command running in the unpacked image (systemd-nspawn with the image's entrypoint as
PID 1, its user and working directory)."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path

from tests.packaging.debs import VERSION
from tests.packaging.image_fixtures import Image

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
RUN_TIMEOUT_S = 300


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layer_names(image: Image) -> dict[str, tarfile.TarInfo]:
    (layer,) = image.manifest()["layers"]
    path = image.layout / "blobs" / "sha256" / layer["digest"].split(":", 1)[1]
    with tarfile.open(path, "r:gz") as tar:
        return {m.name.removeprefix("./").rstrip("/"): m for m in tar.getmembers()}


def test_every_blob_matches_its_digest_and_size(image: Image) -> None:
    blobs = sorted((image.layout / "blobs" / "sha256").iterdir())
    assert blobs, "no blobs"
    for blob in blobs:
        assert _sha256(blob.read_bytes()) == f"sha256:{blob.name}", f"{blob} is corrupt"
    index = json.loads((image.layout / "index.json").read_text())
    manifest = image.manifest()
    descriptors = [*index["manifests"], manifest["config"], *manifest["layers"]]
    for d in descriptors:
        data = image.blob(d["digest"])
        assert len(data) == d["size"], f"{d['digest']}: size {len(data)} != {d['size']}"
    # every blob is reachable: nothing stale left in the archive
    assert {f"sha256:{b.name}" for b in blobs} == {d["digest"] for d in descriptors}


def test_index_and_manifest_are_oci_with_the_image_named(image: Image) -> None:
    layout = json.loads((image.layout / "oci-layout").read_text())
    assert layout == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((image.layout / "index.json").read_text())
    assert index["schemaVersion"] == 2
    assert index.get("mediaType", OCI_INDEX) == OCI_INDEX
    (desc,) = index["manifests"]
    assert desc["mediaType"] == OCI_MANIFEST
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == VERSION
    name = f"docker.io/library/{image.spec.package}:{VERSION}"
    assert desc["annotations"]["io.containerd.image.name"] == name
    manifest = image.manifest()
    assert manifest["schemaVersion"] == 2
    assert manifest["config"]["mediaType"] == OCI_CONFIG
    assert [layer["mediaType"] for layer in manifest["layers"]] == [OCI_LAYER_GZIP]


def test_docker_archive_index_names_the_same_blobs(image: Image) -> None:
    (entry,) = json.loads((image.layout / "manifest.json").read_text())
    manifest = image.manifest()
    assert entry["RepoTags"] == [f"{image.spec.package}:{VERSION}"]
    assert entry["Config"] == "blobs/sha256/" + manifest["config"]["digest"].split(":")[1]
    assert entry["Layers"] == [
        "blobs/sha256/" + layer["digest"].split(":")[1] for layer in manifest["layers"]
    ]


def test_config_runs_the_part_in_the_foreground_as_its_user(image: Image) -> None:
    config = image.config()
    spec = image.spec
    assert config["architecture"] == "amd64"
    assert config["os"] == "linux"
    c = config["config"]
    assert c["Entrypoint"] == ["/usr/bin/tini", "--"]
    assert c["Cmd"] == list(spec.command)
    assert c["User"] == spec.user
    assert c["WorkingDir"] == spec.state_dir
    assert set(c["Volumes"]) == {spec.state_dir, "/etc/edgefleet"}
    assert set(c["ExposedPorts"]) == set(spec.ports)
    env = dict(item.split("=", 1) for item in c["Env"])
    assert env["CREDENTIALS_DIRECTORY"] == f"/etc/edgefleet/credentials/{spec.name}"
    assert c["Labels"]["org.opencontainers.image.version"] == VERSION
    assert c["Labels"]["org.opencontainers.image.title"]
    # diff_ids are the digests of the uncompressed layers
    (layer,) = image.manifest()["layers"]
    uncompressed = gzip.decompress(image.blob(layer["digest"]))
    assert config["rootfs"] == {"type": "layers", "diff_ids": [_sha256(uncompressed)]}


def test_layer_holds_the_virtualenv_the_command_and_no_device_nodes(image: Image) -> None:
    names = _layer_names(image)
    venv = f"opt/edgefleet/{image.spec.name}/bin/python"
    assert venv in names, f"{venv} missing from the layer"
    command = f"usr/bin/{image.spec.command[0]}"
    assert command in names, f"{command} missing from the layer"
    assert "usr/bin/tini" in names
    assert "etc/passwd" in names
    devices = [n for n, m in names.items() if m.ischr() or m.isblk()]
    assert devices == [], f"device nodes in the layer: {devices[:5]}"
    lists = [n for n in names if n.startswith("var/lib/apt/lists/") and n.endswith("Packages")]
    assert lists == [], "apt lists left in the image"
    debs = [n for n in names if n.startswith("var/cache/apt/archives/") and n.endswith(".deb")]
    assert debs == [], "downloaded .debs left in the image"
    assert not any(n.startswith("usr/share/man/man") for n in names), "man pages in the image"


# A Debian bookworm root filesystem's top level (usr-merged: bin, lib, sbin are links).
DEBIAN_TOP = {
    "bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "media", "mnt",
    "opt", "proc", "root", "run", "sbin", "srv", "sys", "tmp", "usr", "var",
}  # fmt: skip


def test_layer_carries_no_path_of_the_build_host_and_gnu_tar_reads_it(image: Image) -> None:
    names = _layer_names(image)
    top = {n.split("/", 1)[0] for n in names if n not in ("", ".")}
    assert top <= DEBIAN_TOP, f"not of a Debian root filesystem: {sorted(top - DEBIAN_TOP)}"
    for name in (".cache", "dist", "dist-test"):  # where the tests and make deb put .debs
        leaked = [n for n in names if f"/{name}/" in f"/{n}/"]
        assert leaked == [], f"the build host's paths in the layer: {leaked[:3]}"
    assert [n for n in names if n.startswith("tmp/")] == [], "files left in /tmp"
    # GNU tar (and umoci, a Go tar reader, in the fixture) read every header: a layer
    # Python's lenient reader takes can still hold one they refuse.
    (layer,) = image.manifest()["layers"]
    path = image.layout / "blobs" / "sha256" / layer["digest"].split(":", 1)[1]
    listed = subprocess.run(["tar", "-tzf", str(path)], check=False, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr[-500:]
    assert "./etc/passwd" in listed.stdout.splitlines()


def test_state_dir_is_owned_by_the_part_user(image: Image) -> None:
    passwd = (image.rootfs / "etc" / "passwd").read_text().splitlines()
    users = {line.split(":")[0]: int(line.split(":")[2]) for line in passwd}
    assert image.spec.user in users, f"no user {image.spec.user} in the image"
    owner = (image.rootfs / image.spec.state_dir.lstrip("/")).stat().st_uid
    assert owner == users[image.spec.user]
    label = image.config()["config"]["Labels"]["org.edgefleet.user"]
    assert label.startswith(f"{image.spec.user} {users[image.spec.user]}:")


def _nspawn(image: Image, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` the way a container runtime runs the image: its entrypoint as PID 1,
    as its user, in its working directory, with its environment, and no network."""
    c = image.config()["config"]
    cmd = ["systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "--private-network"]
    cmd += [f"--machine=ef-image-{image.spec.name}"]
    cmd += ["-D", str(image.rootfs), f"--user={c['User']}", f"--chdir={c['WorkingDir']}"]
    cmd += [f"--setenv={item}" for item in c["Env"]]
    cmd += [*c["Entrypoint"], *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)


def test_command_answers_help_in_the_unpacked_image(image: Image) -> None:
    program = image.spec.command[0]
    done = _nspawn(image, program, "--help")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"usage: {program}" in done.stdout


def test_check_config_passes_on_a_config_in_the_image(image: Image) -> None:
    state = image.spec.state_dir
    if image.spec.name == "agent":
        text = (
            f'[agent]\ndevice_id = "image-test"\nstate_dir = "{state}"\n'
            'profile = "x86-gateway"\n[[cameras]]\nname = "c1"\nkind = "synthetic"\n'
        )
        name = "agent.toml"
    else:
        text = f'[server]\nstate_dir = "{state}"\n'
        name = "fleet.toml"
    config = image.rootfs / "etc" / "edgefleet" / name
    config.write_text(text)
    try:
        done = _nspawn(
            image, image.spec.command[0], "check-config", "--config", f"/etc/edgefleet/{name}"
        )
    finally:
        config.unlink()
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"/etc/edgefleet/{name}: ok" in done.stdout


def test_podman_loads_the_archive_under_its_name(image: Image, tmp_path: Path) -> None:
    # A store of its own (podman wants a short runroot), not the machine's.
    with tempfile.TemporaryDirectory(prefix="ef-podman-") as run:
        _podman_load(image, ["--root", str(tmp_path / "root"), "--runroot", run])


def _podman_load(image: Image, store: list[str]) -> None:
    store += ["--storage-driver", "vfs"]
    load = subprocess.run(
        ["podman", *store, "load", "--input", str(image.archive)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert load.returncode == 0, load.stdout + load.stderr
    name = f"docker.io/library/{image.spec.package}:{VERSION}"
    inspect = subprocess.run(
        ["podman", *store, "image", "inspect", name],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert inspect.returncode == 0, inspect.stdout + inspect.stderr
    (loaded,) = json.loads(inspect.stdout)
    assert loaded["Config"]["Cmd"] == list(image.spec.command)
    assert loaded["Config"]["User"] == image.spec.user
    assert loaded["RootFS"]["Layers"] == image.config()["rootfs"]["diff_ids"]
