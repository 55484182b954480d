"""Pruning the bundle repository keeps what a TUF client needs: python-tuf's own ngclient
Updater, fresh or at an older version, still refreshes and downloads every published
release afterwards."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tuf.api.exceptions import DownloadHTTPError
from tuf.ngclient import FetcherInterface, Updater

from agent.kernel.bundle import init_bundle
from fleet_server.repository import KeyStore, Repository, build_bundle
from fleet_server.repository.prune import metadata_to_remove, prune_repository, versioned

REPO_ROOT = Path(__file__).resolve().parents[3]
TINY_TFLITE = REPO_ROOT / "tests" / "data" / "tiny_classifier.tflite"
PREFIX = "edgefleet:/"
RELEASES = 8
KEEP = 2


class DirFetcher(FetcherInterface):
    """Maps ``edgefleet:/<path>`` to ``<root>/<path>``; a missing file is a 404."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _fetch(self, url: str) -> Iterator[bytes]:
        path = self.root / url.removeprefix(PREFIX)
        if not path.is_file():
            raise DownloadHTTPError(f"{url} not found", 404)
        yield path.read_bytes()


def updater(repo: Repository, client: Path) -> Updater:
    metadata = client / "metadata"
    if not metadata.exists():
        metadata.mkdir(parents=True)
        (client / "targets").mkdir()
        (metadata / "root.json").write_bytes((repo.metadata_dir / "1.root.json").read_bytes())
    return Updater(
        metadata_dir=str(metadata),
        metadata_base_url=f"{PREFIX}metadata/",
        target_dir=str(client / "targets"),
        target_base_url=f"{PREFIX}targets/",
        fetcher=DirFetcher(repo.path),
        bootstrap=None,  # the root.json in the client's metadata directory
    )


@pytest.fixture(autouse=True)
def passphrase(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.delenv("EDGEFLEET_KEY_PASSPHRASE_ROOT", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", "retention test passphrase")


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A repository with RELEASES releases of "tiny" (a client refreshed after the 2nd
    one, in ``old-client``), copied per test."""
    base = tmp_path_factory.mktemp("published")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("CREDENTIALS_DIRECTORY", raising=False)
        mp.setenv("EDGEFLEET_KEY_PASSPHRASE", "retention test passphrase")
        _publish(base)
    return base / "repo", base / "old-client"


def _publish(base: Path) -> None:
    keystore = KeyStore.create(base / "keys", root_keys=1, root_threshold=1)
    repo = Repository(base / "repo")
    repo.init(keystore)
    bundle = base / "bundle"
    init_bundle(TINY_TFLITE, bundle, name="tiny", version="1.0.0")
    for release in range(1, RELEASES + 1):
        build_bundle(bundle, release=release, version=f"1.{release}.0")
        repo.publish(bundle, keystore)
        if release == 2:
            updater(repo, base / "old-client").refresh()


@pytest.fixture
def repo(tmp_path: Path, published: tuple[Path, Path]) -> Repository:
    shutil.copytree(published[0], tmp_path / "repo")
    shutil.copytree(published[1], tmp_path / "old-client")
    return Repository(tmp_path / "repo")


def _download_all(repo: Repository, client: Updater, out: Path) -> None:
    client.refresh()
    out.mkdir(exist_ok=True)
    for bundle in repo.bundles("tiny"):
        for f in bundle.files:
            info = client.get_targetinfo(f.target)
            assert info is not None, f.target
            client.download_target(info, str(out / f"{bundle.release}-{f.file}"))


def test_old_versions_go_and_fresh_and_old_clients_still_update(
    tmp_path: Path, repo: Repository
) -> None:
    current = repo.snapshot().signed.version
    assert current == RELEASES + 1
    result = prune_repository(repo, keep_versions=KEEP)
    names = sorted(p.name for p in repo.metadata_dir.iterdir())
    kept = set(range(current - KEEP, current + 1))
    assert versioned(names) == {"snapshot": sorted(kept), "targets": sorted(kept)}
    assert {"1.root.json", "root.json", "timestamp.json"} <= set(names)
    assert len(result.metadata_removed) == 2 * (current - KEEP - 1)
    assert result.targets_removed == []
    _download_all(repo, updater(repo, tmp_path / "fresh"), tmp_path / "fresh-out")
    old = updater(repo, tmp_path / "old-client")
    _download_all(repo, old, tmp_path / "old-out")
    assert old.get_targetinfo(f"bundles/tiny/{RELEASES}/manifest.json") is not None


def test_a_client_that_read_a_kept_older_timestamp_finds_its_snapshot_and_targets(
    repo: Repository,
) -> None:
    prune_repository(repo, keep_versions=KEEP)
    current = repo.snapshot().signed.version
    for version in range(current - KEEP, current + 1):
        assert (repo.metadata_dir / f"{version}.snapshot.json").is_file()
        assert (repo.metadata_dir / f"{version}.targets.json").is_file()


def test_an_orphan_target_goes_after_its_grace_and_published_files_stay(
    tmp_path: Path, repo: Repository
) -> None:
    orphan_dir = repo.targets_dir / "bundles" / "tiny" / "99"
    orphan_dir.mkdir(parents=True)
    old, fresh = orphan_dir / "aa.manifest.json", orphan_dir / "bb.manifest.json"
    old.write_bytes(b"{}")
    fresh.write_bytes(b"{}")
    week_ago = old.stat().st_mtime - 8 * 86_400
    os.utime(old, (week_ago, week_ago))
    published = [p for p in repo.targets_dir.rglob("*") if p.is_file() and p.parent != orphan_dir]
    dry = prune_repository(repo, keep_versions=KEEP, orphan_grace_s=7 * 86_400, dry_run=True)
    assert dry.targets_removed == ["bundles/tiny/99/aa.manifest.json"]
    assert old.exists()
    result = prune_repository(repo, keep_versions=KEEP, orphan_grace_s=7 * 86_400)
    assert result.targets_removed == ["bundles/tiny/99/aa.manifest.json"]
    assert not old.exists()
    assert fresh.exists()
    assert all(p.exists() for p in published)
    _download_all(repo, updater(repo, tmp_path / "fresh"), tmp_path / "out")


def test_metadata_a_kept_snapshot_names_is_kept_below_the_window() -> None:
    on_disk = {"snapshot": [1, 2, 3, 4, 5], "targets": [1, 2, 3, 4, 5], "director": [1, 2]}
    current = {"snapshot": 5, "targets": 5}
    remove = metadata_to_remove(on_disk, current, {"1.targets.json"}, keep=1)
    assert sorted(remove) == sorted(
        ["1.snapshot.json", "2.snapshot.json", "3.snapshot.json", "2.targets.json",
         "3.targets.json"]
    )  # fmt: skip
