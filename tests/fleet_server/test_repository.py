"""The bundle repository against python-tuf's own client: a real ngclient Updater reads the
repository directory through a local fetcher, as a device side-loading from a USB stick."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api.exceptions import (
    DownloadHTTPError,
    ExpiredMetadataError,
    UnsignedMetadataError,
)
from tuf.api.metadata import Metadata, Root, Targets
from tuf.ngclient import FetcherInterface, Updater

from agent.kernel.bundle import init_bundle
from agent.kernel.errors import BundleError
from agent.wire.manifest import load_manifest
from fleet_server.errors import BundleMismatch, DirectiveError, ReleaseNotNewer, RepoError
from fleet_server.repository import (
    KeyStore,
    Repository,
    build_bundle,
    issue_directive,
    last_counter,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_TFLITE = REPO_ROOT / "tests" / "data" / "tiny_classifier.tflite"
PREFIX = "edgefleet:/"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class DirFetcher(FetcherInterface):
    """Maps ``edgefleet:/<path>`` to ``<root>/<path>``; a missing file is a 404."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _fetch(self, url: str) -> Iterator[bytes]:
        assert url.startswith(PREFIX), url
        path = self.root / url.removeprefix(PREFIX)
        if not path.is_file():
            raise DownloadHTTPError(f"{url} not found", 404)
        with path.open("rb") as f:
            yield f.read()


def updater(repo: Repository, client: Path, *, bootstrap: bytes | None = None) -> Updater:
    (client / "metadata").mkdir(parents=True, exist_ok=True)
    (client / "targets").mkdir(parents=True, exist_ok=True)
    return Updater(
        metadata_dir=str(client / "metadata"),
        metadata_base_url=f"{PREFIX}metadata/",
        target_dir=str(client / "targets"),
        target_base_url=f"{PREFIX}targets/",
        fetcher=DirFetcher(repo.path),
        bootstrap=bootstrap,
    )


@pytest.fixture(autouse=True)
def passphrase(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.delenv("EDGEFLEET_KEY_PASSPHRASE_ROOT", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", "repository test passphrase")


@pytest.fixture(scope="module")
def base_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("base") / "tiny"
    init_bundle(TINY_TFLITE, out, name="tiny", version="1.0.0")
    return out


@pytest.fixture
def bundle(tmp_path: Path, base_bundle: Path) -> Path:
    return Path(shutil.copytree(base_bundle, tmp_path / "bundle"))


@pytest.fixture
def keystore(tmp_path: Path) -> KeyStore:
    return KeyStore.create(tmp_path / "keys", root_keys=3, root_threshold=2)


@pytest.fixture
def repo(tmp_path: Path, keystore: KeyStore) -> Repository:
    repository = Repository(tmp_path / "repo")
    repository.init(keystore)
    return repository


def test_init_writes_the_agreed_layout_with_consistent_snapshots(repo: Repository) -> None:
    names = sorted(p.name for p in repo.metadata_dir.iterdir())
    assert names == [
        "1.root.json",
        "1.snapshot.json",
        "1.targets.json",
        "root.json",
        "timestamp.json",
    ]
    root = repo.root().signed
    assert root.consistent_snapshot is True
    assert (root.roles["root"].threshold, len(root.roles["root"].keyids)) == (2, 3)
    now = utcnow()
    for role, days in (("root", 365), ("targets", 90), ("snapshot", 7), ("timestamp", 1)):
        signed = getattr(repo, role)().signed
        assert abs(signed.expires - (now + timedelta(days=days))) < timedelta(minutes=5), role
    delegations = repo.targets().signed.delegations
    assert delegations is not None
    assert delegations.roles is not None
    director = delegations.roles["director"]
    assert (director.paths, director.terminating, director.threshold) == ([], True, 1)
    with pytest.raises(RepoError, match="already initialised"):
        repo.init(KeyStore(repo.path.parent / "keys"))


def test_ngclient_refreshes_and_downloads_every_file_of_a_published_bundle(
    tmp_path: Path, repo: Repository, keystore: KeyStore, bundle: Path
) -> None:
    published = repo.publish(bundle, keystore)
    assert [f.file for f in published.files] == ["manifest.json", "tiny_classifier.tflite"]
    stored = repo.targets_dir / "bundles" / "tiny" / "1"
    assert sorted(p.name for p in stored.iterdir()) == sorted(
        f"{f.sha256}.{f.file}" for f in published.files
    )
    client = updater(
        repo, tmp_path / "client", bootstrap=(repo.metadata_dir / "1.root.json").read_bytes()
    )
    client.refresh()
    for f in published.files:
        info = client.get_targetinfo(f"bundles/tiny/1/{f.file}")
        assert info is not None
        assert info.custom["bundle"] == "tiny"
        assert (info.custom["version"], info.custom["release"]) == ("1.0.0", 1)
        assert info.custom["profiles"] == []
        path = client.download_target(info, str(tmp_path / f.file))
        assert Path(path).read_bytes() == (bundle / f.file).read_bytes()


def test_release_two_publishes_after_one_and_a_lower_or_equal_release_is_refused(
    tmp_path: Path, repo: Repository, keystore: KeyStore, bundle: Path
) -> None:
    repo.publish(bundle, keystore)
    build_bundle(bundle, release=2, version="1.1.0")
    repo.publish(bundle, keystore)
    assert repo.targets().signed.version == 3
    assert repo.snapshot().signed.version == 3
    assert repo.timestamp().signed.version == 3
    assert [(b.release, b.version) for b in repo.bundles()] == [(1, "1.0.0"), (2, "1.1.0")]
    targets_before = repo.targets().signed.version
    for release in (2, 1):
        build_bundle(bundle, release=release)
        with pytest.raises(ReleaseNotNewer) as err:
            repo.publish(bundle, keystore)
        assert (err.value.release, err.value.highest) == (release, 2)
    assert repo.targets().signed.version == targets_before
    client = updater(
        repo, tmp_path / "client", bootstrap=(repo.metadata_dir / "1.root.json").read_bytes()
    )
    client.refresh()
    info = client.get_targetinfo("bundles/tiny/2/manifest.json")
    assert info is not None
    assert info.custom["version"] == "1.1.0"


def test_publish_refuses_a_model_file_that_differs_from_its_manifest(
    repo: Repository, keystore: KeyStore, bundle: Path
) -> None:
    model = bundle / "tiny_classifier.tflite"
    model.write_bytes(model.read_bytes() + b"\x00")
    with pytest.raises(BundleMismatch, match="run fleetctl bundle build"):
        repo.publish(bundle, keystore)
    assert repo.bundles() == []
    manifest = build_bundle(bundle)
    assert manifest.models["tflite"].size == model.stat().st_size
    assert repo.publish(bundle, keystore).files[1].length == model.stat().st_size


def test_a_file_the_manifest_does_not_list_is_refused(
    repo: Repository, keystore: KeyStore, bundle: Path
) -> None:
    (bundle / "notes.txt").write_text("not part of the bundle")
    with pytest.raises(BundleError, match=r"does not list: notes\.txt"):
        repo.publish(bundle, keystore)
    with pytest.raises(BundleError, match=r"notes\.txt"):
        build_bundle(bundle)
    assert repo.bundles() == []


def test_verify_accepts_the_published_bundle_and_detects_a_modified_file(
    repo: Repository, keystore: KeyStore, bundle: Path
) -> None:
    repo.publish(bundle, keystore)
    assert repo.verify(bundle).release == 1
    model = bundle / "tiny_classifier.tflite"
    data = bytearray(model.read_bytes())
    data[100] ^= 0xFF  # same length, different bytes
    model.write_bytes(bytes(data))
    with pytest.raises(BundleMismatch, match="differs from the signed file") as err:
        repo.verify(bundle)
    assert err.value.file == "tiny_classifier.tflite"


def test_verify_refuses_a_release_that_was_never_published(
    repo: Repository, keystore: KeyStore, bundle: Path
) -> None:
    repo.publish(bundle, keystore)
    build_bundle(bundle, release=5)
    with pytest.raises(BundleMismatch, match="release 5 is not published"):
        repo.verify(bundle)


def test_verify_detects_metadata_not_signed_by_the_root_keys(
    tmp_path: Path, repo: Repository, keystore: KeyStore, bundle: Path
) -> None:
    repo.publish(bundle, keystore)
    path = repo.metadata_dir / f"{repo.targets().signed.version}.targets.json"
    md = Metadata[Targets].from_bytes(path.read_bytes())
    md.sign(CryptoSigner.generate_ed25519())  # replaces the targets key's signature
    path.write_bytes(md.to_bytes())
    with pytest.raises(RepoError, match="targets v2 is not validly signed"):
        repo.verify(bundle)


def test_root_rotation_is_followed_by_a_client_that_trusted_the_old_root(
    tmp_path: Path, repo: Repository, keystore: KeyStore, bundle: Path
) -> None:
    v1 = (repo.metadata_dir / "1.root.json").read_bytes()
    old_root = repo.root().signed
    updater(repo, tmp_path / "client", bootstrap=v1).refresh()
    new_ids = repo.rotate("root", keystore)
    repo.publish(bundle, keystore)

    v2 = repo.root()
    assert v2.signed.version == 2
    assert set(v2.signed.roles["root"].keyids) == set(new_ids)
    assert not set(new_ids) & set(old_root.roles["root"].keyids)
    old_root.verify_delegate("root", v2.signed_bytes, v2.signatures)
    v2.signed.verify_delegate("root", v2.signed_bytes, v2.signatures)
    assert (repo.metadata_dir / "root.json").read_bytes() == (
        repo.metadata_dir / "2.root.json"
    ).read_bytes()
    assert {k.keyid for k in keystore.list_keys("root")} == set(new_ids)

    client = updater(repo, tmp_path / "client")  # bootstraps from its cached v1 root
    client.refresh()
    info = client.get_targetinfo("bundles/tiny/1/manifest.json")
    assert info is not None
    assert (
        json.loads((tmp_path / "client" / "metadata" / "root.json").read_bytes())["signed"][
            "version"
        ]
        == 2
    )


def test_root_rotation_needs_the_threshold_of_old_root_keys_present(
    repo: Repository, keystore: KeyStore
) -> None:
    old = keystore.list_keys("root")
    old[0].path.unlink()  # kept offline elsewhere: 2 of 3 here, threshold 2
    signed_root = repo.root().signed
    repo.rotate("root", KeyStore(keystore.path))
    v2 = repo.root()
    signed_root.verify_delegate("root", v2.signed_bytes, v2.signatures)
    assert {k.keyid for k in old[1:]} <= set(v2.signatures)

    store = KeyStore(keystore.path)
    for key in store.list_keys("root")[:2]:
        key.path.unlink()  # one of three new root keys left
    with pytest.raises(RepoError, match="needs 2 of 3"):
        repo.rotate("root", store)
    assert not (repo.metadata_dir / "3.root.json").exists()
    assert repo.root().signed.version == 2


def test_timestamp_key_rotation_goes_through_a_new_root(
    tmp_path: Path, repo: Repository, keystore: KeyStore, bundle: Path
) -> None:
    repo.publish(bundle, keystore)
    client_dir = tmp_path / "client"
    updater(repo, client_dir, bootstrap=(repo.metadata_dir / "1.root.json").read_bytes()).refresh()
    old = repo.root().signed.roles["timestamp"].keyids
    (new,) = repo.rotate("timestamp", keystore)
    root = repo.root().signed
    assert root.version == 2
    assert root.roles["timestamp"].keyids == [new]
    assert old[0] not in root.keys
    assert list(repo.timestamp().signatures) == [new]
    client = updater(repo, client_dir)
    client.refresh()
    assert client.get_targetinfo("bundles/tiny/1/manifest.json") is not None


def test_targets_and_snapshot_key_rotation_re_sign_their_role(
    tmp_path: Path, repo: Repository, keystore: KeyStore, bundle: Path
) -> None:
    repo.publish(bundle, keystore)
    (targets_key,) = repo.rotate("targets", keystore)
    (snapshot_key,) = repo.rotate("snapshot", keystore)
    assert repo.root().signed.version == 3
    assert list(repo.targets().signatures) == [targets_key]
    assert list(repo.snapshot().signatures) == [snapshot_key]
    client = updater(
        repo, tmp_path / "c", bootstrap=(repo.metadata_dir / "1.root.json").read_bytes()
    )
    client.refresh()
    assert client.get_targetinfo("bundles/tiny/1/tiny_classifier.tflite") is not None


def test_refresh_timestamp_revives_a_repository_whose_timestamp_expired(
    tmp_path: Path, keystore: KeyStore
) -> None:
    repo = Repository(tmp_path / "repo")
    repo.init(keystore, now=utcnow() - timedelta(days=2))
    v1 = (repo.metadata_dir / "1.root.json").read_bytes()
    with pytest.raises(ExpiredMetadataError):
        updater(repo, tmp_path / "a", bootstrap=v1).refresh()
    assert repo.refresh_timestamp(keystore) == 2
    assert repo.timestamp().signed.snapshot_meta.version == 1
    updater(repo, tmp_path / "b", bootstrap=v1).refresh()


def test_refresh_renews_only_the_roles_past_half_their_validity(
    tmp_path: Path, keystore: KeyStore
) -> None:
    repo = Repository(tmp_path / "repo")
    repo.init(keystore, now=utcnow() - timedelta(days=5))
    assert repo.refresh(keystore) == ["snapshot", "timestamp"]
    assert (repo.targets().signed.version, repo.snapshot().signed.version) == (1, 2)
    assert repo.refresh(keystore) == ["timestamp"]
    assert repo.timestamp().signed.version == 3
    v1 = (repo.metadata_dir / "1.root.json").read_bytes()
    updater(repo, tmp_path / "c", bootstrap=v1).refresh()


def test_directive_verifies_against_the_director_delegation(
    repo: Repository, keystore: KeyStore, bundle: Path
) -> None:
    repo.publish(bundle, keystore)
    raw = issue_directive(repo, keystore, "cam-07", "x86-gateway", "tiny", 1)
    directive = Metadata[Targets].from_bytes(raw)
    trusted = repo.targets().signed
    trusted.verify_delegate("director", directive.signed_bytes, directive.signatures)
    signed = directive.signed
    assert signed.version == 1
    assert signed.unrecognized_fields["custom"] == {
        "device_id": "cam-07",
        "hardware_class": "x86-gateway",
    }
    ((path, target),) = signed.targets.items()
    assert path == "bundles/tiny/1/manifest.json"
    repo_target = trusted.targets[path]
    assert (target.length, target.hashes) == (repo_target.length, repo_target.hashes)
    assert timedelta(days=6) < signed.expires - utcnow() <= timedelta(days=7)

    second = Metadata[Targets].from_bytes(
        issue_directive(repo, keystore, "cam-07", "x86-gateway", "tiny", 1)
    )
    assert second.signed.version == 2
    assert last_counter(Repository(repo.path), "cam-07") == 2
    assert last_counter(repo, "cam-08") == 0


def test_directive_with_a_wrong_key_or_altered_fields_fails_verification(
    repo: Repository, keystore: KeyStore, bundle: Path
) -> None:
    repo.publish(bundle, keystore)
    trusted = repo.targets().signed
    directive = Metadata[Targets].from_bytes(
        issue_directive(repo, keystore, "cam-07", "x86-gateway", "tiny", 1)
    )
    directive.signed.unrecognized_fields["custom"]["device_id"] = "cam-99"
    with pytest.raises(UnsignedMetadataError):
        trusted.verify_delegate("director", directive.signed_bytes, directive.signatures)

    forged = Metadata[Targets].from_bytes(
        issue_directive(repo, keystore, "cam-07", "x86-gateway", "tiny", 1)
    )
    forged.sign(CryptoSigner.generate_ed25519())
    with pytest.raises(UnsignedMetadataError):
        trusted.verify_delegate("director", forged.signed_bytes, forged.signatures)

    root_signed = Metadata[Root].from_bytes((repo.metadata_dir / "1.root.json").read_bytes())
    targets_key = keystore.signers(root_signed.signed.roles["targets"].keyids)[0]
    forged.sign(targets_key)  # a fleet key, but not the director's
    with pytest.raises(UnsignedMetadataError):
        trusted.verify_delegate("director", forged.signed_bytes, forged.signatures)


def test_director_rotation_invalidates_directives_signed_by_the_old_key(
    tmp_path: Path, repo: Repository, keystore: KeyStore, bundle: Path
) -> None:
    repo.publish(bundle, keystore)
    old = Metadata[Targets].from_bytes(
        issue_directive(repo, keystore, "cam-07", "x86-gateway", "tiny", 1)
    )
    repo.rotate("director", keystore)
    assert repo.root().signed.version == 1, "the director is delegated by targets, not root"
    trusted = repo.targets().signed
    with pytest.raises(UnsignedMetadataError):
        trusted.verify_delegate("director", old.signed_bytes, old.signatures)
    new = Metadata[Targets].from_bytes(
        issue_directive(repo, keystore, "cam-07", "x86-gateway", "tiny", 1)
    )
    trusted.verify_delegate("director", new.signed_bytes, new.signatures)
    assert new.signed.version == 2
    client = updater(
        repo, tmp_path / "c", bootstrap=(repo.metadata_dir / "1.root.json").read_bytes()
    )
    client.refresh()


def test_directive_for_an_unpublished_release_or_another_profile_is_refused(
    repo: Repository, keystore: KeyStore, bundle: Path
) -> None:
    manifest = load_manifest(bundle)
    raw = json.loads((bundle / "manifest.json").read_text())
    raw["profiles"] = ["jetson-orin"]
    (bundle / "manifest.json").write_text(json.dumps(raw))
    repo.publish(bundle, keystore)
    assert manifest.profiles == []
    with pytest.raises(DirectiveError, match="release 2 is not published"):
        issue_directive(repo, keystore, "cam-07", "jetson-orin", "tiny", 2)
    with pytest.raises(DirectiveError, match="not 'x86-gateway'"):
        issue_directive(repo, keystore, "cam-07", "x86-gateway", "tiny", 1)
    with pytest.raises(DirectiveError, match="not a valid topic level"):
        issue_directive(repo, keystore, "cam/07", "jetson-orin", "tiny", 1)
    with pytest.raises(DirectiveError, match="not in the future"):
        issue_directive(repo, keystore, "cam-07", "jetson-orin", "tiny", 1, expires_in=timedelta(0))
    assert last_counter(repo, "cam-07") == 0, "a refused directive uses no counter"
    issue_directive(repo, keystore, "cam-07", "jetson-orin", "tiny", 1, counter=41)
    assert last_counter(repo, "cam-07") == 41
