"""fleetctl keys / repo / bundle / directive as an operator runs them: subprocesses whose
exit codes and output are checked, and a python-tuf client reading what they wrote."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tuf.api.exceptions import DownloadHTTPError
from tuf.api.metadata import Metadata, Targets
from tuf.ngclient import FetcherInterface, Updater

from agent.kernel.bundle import init_bundle

REPO_ROOT = Path(__file__).resolve().parents[2]
FLEETCTL = Path(sys.executable).parent / "fleetctl"
TINY_TFLITE = REPO_ROOT / "tests" / "data" / "tiny_classifier.tflite"
PASSPHRASE = "fleetctl test passphrase"  # noqa: S105 (generated keys, test only)


class DirFetcher(FetcherInterface):
    """Maps ``edgefleet:/<path>`` to ``<root>/<path>``; a missing file is a 404."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _fetch(self, url: str) -> Iterator[bytes]:
        path = self.root / url.removeprefix("edgefleet:/")
        if not path.is_file():
            raise DownloadHTTPError(f"{url} not found", 404)
        yield path.read_bytes()


def client(repo: Path, where: Path, bootstrap: bytes | None = None) -> Updater:
    (where / "metadata").mkdir(parents=True, exist_ok=True)
    return Updater(
        str(where / "metadata"),
        "edgefleet:/metadata/",
        str(where),
        "edgefleet:/targets/",
        fetcher=DirFetcher(repo),
        bootstrap=bootstrap,
    )


def fleetctl(
    *args: str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    assert FLEETCTL.exists(), f"{FLEETCTL} missing: run .venv/bin/pip install -e ."
    return subprocess.run(
        [str(FLEETCTL), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def ok(*args: str | Path) -> str:
    proc = fleetctl(*args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(autouse=True)
def passphrase(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.delenv("EDGEFLEET_KEY_PASSPHRASE_ROOT", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)


@pytest.fixture(scope="module")
def base_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("base") / "tiny"
    init_bundle(TINY_TFLITE, out, name="tiny", version="1.0.0")
    return out


@pytest.fixture
def fleet(tmp_path: Path, base_bundle: Path) -> tuple[Path, Path, Path]:
    """(keystore, repository, bundle) made by fleetctl keys init and repo init."""
    keys, repo = tmp_path / "keys", tmp_path / "repo"
    ok("keys", "init", "--keystore", keys, "--root-keys", "3", "--root-threshold", "2")
    ok("repo", "init", "--repo", repo, "--keystore", keys)
    return keys, repo, Path(shutil.copytree(base_bundle, tmp_path / "bundle"))


def test_publish_list_verify_and_directive_end_to_end(
    tmp_path: Path, fleet: tuple[Path, Path, Path]
) -> None:
    keys, repo, bundle = fleet
    listed = json.loads(ok("keys", "list", "--keystore", keys, "--json"))
    assert listed["root_threshold"] == 2
    assert sorted(k["role"] for k in listed["keys"]) == sorted(
        ["root"] * 3 + ["targets", "snapshot", "timestamp", "director"]
    )

    published = json.loads(
        ok("bundle", "publish", bundle, "--repo", repo, "--keystore", keys, "--json")
    )
    assert (published["name"], published["release"]) == ("tiny", 1)
    model = bundle / "tiny_classifier.tflite"
    model.write_bytes(model.read_bytes() + b"\x01")
    built = json.loads(
        ok("bundle", "build", bundle, "--release", "2", "--version", "1.1.0", "--json")
    )
    assert built["models"]["tflite"]["size"] == model.stat().st_size
    ok("bundle", "publish", bundle, "--repo", repo, "--keystore", keys)
    assert "ok: matches the signed release" in ok("bundle", "verify", bundle, "--repo", repo)
    bundles = json.loads(ok("bundle", "list", "--repo", repo, "--json"))
    assert [(b["release"], b["version"]) for b in bundles] == [(1, "1.0.0"), (2, "1.1.0")]
    assert [f["file"] for f in bundles[1]["files"]] == ["manifest.json", "tiny_classifier.tflite"]

    out = tmp_path / "directive.json"
    ok(
        "directive", "issue", "--repo", repo, "--keystore", keys, "--device", "cam-07",
        "--hardware-class", "x86-gateway", "--bundle", "tiny", "--release", "2",
        "--expires-in", "12h", "--out", out,
    )  # fmt: skip
    directive = Metadata[Targets].from_bytes(out.read_bytes())
    assert directive.signed.unrecognized_fields["custom"]["device_id"] == "cam-07"

    updater = client(repo, tmp_path / "device", (repo / "metadata" / "1.root.json").read_bytes())
    updater.refresh()
    trusted = Metadata[Targets].from_bytes(
        (tmp_path / "device" / "metadata" / "targets.json").read_bytes()
    )
    trusted.signed.verify_delegate("director", directive.signed_bytes, directive.signatures)
    ((path, target),) = directive.signed.targets.items()
    info = updater.get_targetinfo(path)
    assert info is not None
    assert (info.length, info.hashes) == (target.length, target.hashes)
    model_info = updater.get_targetinfo("bundles/tiny/2/tiny_classifier.tflite")
    assert model_info is not None
    assert Path(updater.download_target(model_info)).read_bytes() == model.read_bytes()


def test_key_rotation_from_the_cli_is_followed_by_a_device(
    tmp_path: Path, fleet: tuple[Path, Path, Path]
) -> None:
    keys, repo, bundle = fleet
    v1 = (repo / "metadata" / "1.root.json").read_bytes()
    client(repo, tmp_path / "device", v1).refresh()
    for role, root_version in (("root", 2), ("timestamp", 3), ("director", 3)):
        rotated = json.loads(
            ok("keys", "rotate", role, "--keystore", keys, "--repo", repo, "--json")
        )
        assert rotated["root_version"] == root_version
    ok("bundle", "publish", bundle, "--repo", repo, "--keystore", keys)
    device = client(repo, tmp_path / "device")
    device.refresh()
    assert device.get_targetinfo("bundles/tiny/1/manifest.json") is not None
    every = json.loads(ok("keys", "list", "--keystore", keys, "--all", "--json"))["keys"]
    assert sum(1 for k in every if k["retired"]) == 3 + 1 + 1


def test_refresh_re_signs_the_timestamp(fleet: tuple[Path, Path, Path]) -> None:
    keys, repo, _ = fleet
    report = json.loads(ok("repo", "refresh", "--repo", repo, "--keystore", keys, "--json"))
    assert report["renewed"] == ["timestamp"]
    ok("repo", "refresh", "--repo", repo, "--keystore", keys, "--timestamp-only")
    timestamp = json.loads((repo / "metadata" / "timestamp.json").read_bytes())
    assert timestamp["signed"]["version"] == 3


def test_errors_are_one_line_with_exit_code_2(
    tmp_path: Path, fleet: tuple[Path, Path, Path]
) -> None:
    keys, repo, bundle = fleet
    ok("bundle", "publish", bundle, "--repo", repo, "--keystore", keys)
    again = fleetctl("bundle", "publish", bundle, "--repo", repo, "--keystore", keys)
    assert again.returncode == 2
    assert again.stderr.count("\n") == 1
    assert "release 1 is not newer than the published release 1" in again.stderr

    wrong = {**os.environ, "EDGEFLEET_KEY_PASSPHRASE": "a wrong passphrase"}
    proc = fleetctl("repo", "refresh", "--repo", repo, "--keystore", keys, env=wrong)
    assert proc.returncode == 2
    assert "wrong passphrase" in proc.stderr

    missing = {k: v for k, v in os.environ.items() if not k.startswith("EDGEFLEET_KEY")}
    proc = fleetctl("keys", "init", "--keystore", tmp_path / "k2", env=missing)
    assert proc.returncode == 2
    assert "no passphrase for the root keys" in proc.stderr
    assert not (tmp_path / "k2").exists()

    proc = fleetctl("bundle", "list", "--repo", tmp_path / "nothing")
    assert proc.returncode == 2
    assert "fleetctl repo init" in proc.stderr

    proc = fleetctl(
        "directive", "issue", "--repo", repo, "--keystore", keys, "--device", "cam-07",
        "--hardware-class", "x86-gateway", "--bundle", "tiny", "--release", "9",
    )  # fmt: skip
    assert proc.returncode == 2
    assert "release 9 is not published" in proc.stderr


@pytest.mark.parametrize(
    "command",
    [
        ("keys", "init"),
        ("keys", "list"),
        ("keys", "rotate"),
        ("repo", "init"),
        ("repo", "refresh"),
        ("bundle", "build"),
        ("bundle", "publish"),
        ("bundle", "verify"),
        ("bundle", "list"),
        ("directive", "issue"),
    ],
)
def test_every_command_has_help_with_an_example(command: tuple[str, str]) -> None:
    out = ok(*command, "--help")
    assert "example:" in out
    assert f"fleetctl {' '.join(command)}" in out
