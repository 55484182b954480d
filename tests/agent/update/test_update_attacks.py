"""The attacks of issue 4 that the device's update client must stop, each against a real
signed repository on disk: nothing unverified is kept, the trusted state does not move,
and no partial bundle is left behind."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from securesystemslib.formats import encode_canonical
from securesystemslib.signer import Key, Signature, Signer
from tuf.api.metadata import Metadata, Root

from agent.kernel.bundle import load_bundle
from agent.update import (
    BundleRejected,
    DirectiveRefused,
    FetchFailed,
    MetadataRejected,
    RollbackRefused,
    StaleMetadataError,
    TrustRootError,
)
from agent.update.directive import verify_directive
from agent.update.fetchers import LocalDirFetcher
from agent.update.trust import check_root
from tests.agent.update.tuf_repo import (
    FakeClock,
    TufRepo,
    make_device,
    manifest_for,
    new_key,
    tree_state,
    utc_now,
)


@pytest.fixture
def repo(tmp_path: Path) -> TufRepo:
    return TufRepo(tmp_path / "repo")


def _sign_dict(signed: dict[str, Any], signers: list[Signer]) -> list[dict[str, Any]]:
    payload = encode_canonical(signed).encode()  # type: ignore[union-attr]
    return [signer.sign(payload).to_dict() for signer in signers]


def _write_raw_root(repo: TufRepo, signed: dict[str, Any], signers: list[Signer]) -> None:
    """Write a root whose JSON the Metadata API would not build (keyids listed twice)."""
    data = json.dumps({"signed": signed, "signatures": _sign_dict(signed, signers)}).encode()
    (repo.metadata_dir / f"{signed['version']}.root.json").write_bytes(data)


# -- 1: unsigned metadata, wrong key, too few signatures ------------------------------------


def test_attack_01_unsigned_metadata_is_rejected_and_nothing_written(
    tmp_path: Path, repo: TufRepo
) -> None:
    device = make_device(tmp_path, repo)
    device.client.refresh()
    before = tree_state(device.trust_dir)
    repo.publish_bundle("det", 1)
    repo.edit_json("timestamp.json", lambda d: d.update(signatures=[]))

    with pytest.raises(MetadataRejected, match="timestamp"):
        device.client.refresh()

    assert tree_state(device.trust_dir) == before


def test_attack_01_metadata_signed_by_a_wrong_key_is_rejected(
    tmp_path: Path, repo: TufRepo
) -> None:
    device = make_device(tmp_path, repo)
    device.client.refresh()
    before = tree_state(device.trust_dir)
    repo.signers["snapshot"] = [new_key()]  # not the key root lists for snapshot
    repo.publish_bundle("det", 1)

    with pytest.raises(MetadataRejected, match="snapshot"):
        device.client.refresh()

    assert tree_state(device.trust_dir)["snapshot.json"] == before["snapshot.json"]
    assert tree_state(device.trust_dir)["targets.json"] == before["targets.json"]


def test_attack_01_fewer_root_signatures_than_the_threshold_are_rejected(tmp_path: Path) -> None:
    repo = TufRepo(tmp_path / "repo", root_keys=2, root_threshold=2)
    device = make_device(tmp_path, repo)
    device.client.refresh()
    repo.root.signed.version += 1
    repo.write_root(signers=repo.signers["root"][:1])  # 1 of 2

    with pytest.raises(MetadataRejected, match="root was signed by 1/2 keys"):
        device.client.refresh()

    assert not (device.trust_dir / "root_history" / "2.root.json").exists()


def test_attack_01_directive_not_signed_by_the_director_is_refused(
    tmp_path: Path, repo: TufRepo
) -> None:
    published = repo.publish_bundle("det", 1)
    device = make_device(tmp_path, repo)
    forged = repo.directive(published, counter=1, signers=repo.signers["targets"])

    with pytest.raises(DirectiveRefused, match="not signed by the director"):
        device.client.check_directive(forged)

    assert device.client.applied_counter() == 0


# -- 2: one key counts once ----------------------------------------------------------------


def test_attack_02_a_keyid_listed_twice_in_a_role_is_refused(tmp_path: Path, repo: TufRepo) -> None:
    device = make_device(tmp_path, repo)
    device.client.refresh()
    signed = repo.root.signed.to_dict()
    signed["version"] = 2
    ts_keyid = repo.signers["timestamp"][0].public_key.keyid
    signed["roles"]["timestamp"] = {"keyids": [ts_keyid, ts_keyid], "threshold": 2}
    _write_raw_root(repo, signed, repo.signers["root"])

    with pytest.raises(MetadataRejected, match="Nonunique keyids"):
        device.client.refresh()


def test_attack_02_one_signature_listed_twice_counts_once(tmp_path: Path, repo: TufRepo) -> None:
    second = new_key()
    repo.root.signed.add_key(second.public_key, "timestamp")
    repo.root.signed.roles["timestamp"].threshold = 2
    repo.root.signed.version += 1
    repo.write_root()
    device = make_device(tmp_path, repo)
    repo.commit()  # timestamp signed by the first key only
    signature = repo.timestamp.signatures[repo.signers["timestamp"][0].public_key.keyid]
    repo.edit_json("timestamp.json", lambda d: d["signatures"].append(signature.to_dict()))

    with pytest.raises(MetadataRejected, match="Multiple signatures"):
        device.client.refresh()
    repo.commit()  # the same timestamp without the copied signature: 1 of 2
    with pytest.raises(MetadataRejected, match="signed by 1/2"):
        device.client.refresh()


def test_attack_02_one_key_under_two_keyids_counts_once(tmp_path: Path, repo: TufRepo) -> None:
    key = repo.signers["timestamp"][0].public_key
    alias = Key.from_dict("0" * 64, key.to_dict())
    root = repo.root.signed
    root.keys[alias.keyid] = alias
    root.roles["timestamp"].keyids.append(alias.keyid)
    root.roles["timestamp"].threshold = 2
    root.version += 1
    repo.write_root()
    device = make_device(tmp_path, repo)
    repo.commit()
    signature = repo.timestamp.signatures[key.keyid]
    repo.timestamp.signatures[alias.keyid] = Signature(alias.keyid, signature.signature)
    (repo.metadata_dir / "timestamp.json").write_bytes(repo.timestamp.to_bytes())
    # python-tuf alone counts the one key twice ...
    root.verify_delegate("timestamp", repo.timestamp.signed_bytes, repo.timestamp.signatures)

    # ... the client does not.
    with pytest.raises(MetadataRejected, match="lists one key as"):
        device.client.refresh()
    with pytest.raises(TrustRootError, match="lists one key as"):
        check_root(repo.root.to_bytes(), "root v2")


def test_attack_02_one_director_key_under_two_keyids_counts_once(tmp_path: Path) -> None:
    repo = TufRepo(tmp_path / "repo")
    key = repo.signers["director"][0].public_key
    alias = Key.from_dict("1" * 64, key.to_dict())
    delegations = repo.targets.signed.delegations
    assert delegations is not None
    assert delegations.roles is not None
    delegations.keys[alias.keyid] = alias
    delegations.roles["director"].keyids.append(alias.keyid)
    delegations.roles["director"].threshold = 2
    published = repo.publish_bundle("det", 1)
    device = make_device(tmp_path, repo)
    directive = Metadata.from_bytes(repo.directive(published, counter=1))
    sig = directive.signatures[key.keyid]
    directive.signatures[alias.keyid] = Signature(alias.keyid, sig.signature)
    data = directive.to_bytes()
    # python-tuf alone counts the one key twice ...
    repo.targets.signed.verify_delegate("director", directive.signed_bytes, directive.signatures)

    # ... the client refuses such targets metadata, and such a directive.
    with pytest.raises(MetadataRejected, match="role 'director' lists one key as"):
        device.client.check_directive(data)
    with pytest.raises(DirectiveRefused, match="lists one key as"):
        verify_directive(
            data, repo.targets.signed, device_id="cam-01", hardware_class="x86-gateway"
        )


# -- 3: bytes swapped after signing ----------------------------------------------------------


@pytest.mark.parametrize("file", ["model.onnx", "manifest.json"])
def test_attack_03_bytes_swapped_after_signing_are_rejected_and_partial_files_deleted(
    tmp_path: Path, repo: TufRepo, file: str
) -> None:
    published = repo.publish_bundle("det", 1, model=b"A" * 5000)
    target = repo.targets.signed.targets[f"bundles/det/1/{file}"]
    stored = repo.target_file(target)
    stored.write_bytes(bytes(b ^ 0x01 for b in stored.read_bytes()))  # same length
    device = make_device(tmp_path, repo)
    assignment = device.client.check_directive(repo.directive(published, counter=1))

    with pytest.raises(FetchFailed, match="signed length/hashes"):
        device.client.download_bundle(assignment, tmp_path / "slot-b")

    assert not (tmp_path / "slot-b").exists()


# -- 4: rollback -------------------------------------------------------------------------------


def test_attack_04_older_metadata_version_is_rejected(tmp_path: Path, repo: TufRepo) -> None:
    repo.publish_bundle("det", 1)
    old_timestamp = (repo.metadata_dir / "timestamp.json").read_bytes()
    repo.publish_bundle("det", 2)
    device = make_device(tmp_path, repo)
    device.client.refresh()
    before = tree_state(device.trust_dir)
    (repo.metadata_dir / "timestamp.json").write_bytes(old_timestamp)

    with pytest.raises(MetadataRejected, match="version"):
        device.client.refresh()

    assert tree_state(device.trust_dir) == before


def test_attack_04_lower_release_is_refused(tmp_path: Path, repo: TufRepo) -> None:
    older = repo.publish_bundle("det", 2)
    repo.publish_bundle("det", 3)
    device = make_device(tmp_path, repo)

    with pytest.raises(RollbackRefused, match="below the installed 3"):
        device.client.check_directive(
            repo.directive(older, counter=1), installed_name="det", installed_release=3
        )


# -- 5 and 6: freeze, expired local copies ----------------------------------------------------


def test_attack_05_expired_timestamp_is_rejected_and_the_client_reports_stale(
    tmp_path: Path, repo: TufRepo
) -> None:
    device = make_device(tmp_path, repo)
    device.client.refresh()
    root_before = (device.trust_dir / "root.json").read_bytes()
    repo.publish_bundle("det", 1)
    repo.write_timestamp(expires=utc_now() - timedelta(minutes=1))

    with pytest.raises(StaleMetadataError, match=r"timestamp\.json is expired"):
        device.client.refresh()

    assert device.client.stale
    assert "expired" in device.client.stale_reason
    assert (device.trust_dir / "root.json").read_bytes() == root_before
    repo.write_timestamp()  # the repository signs again: the device recovers
    device.client.refresh()
    assert not device.client.stale


def test_attack_06_an_expired_local_copy_does_not_block_a_valid_update(
    tmp_path: Path, repo: TufRepo
) -> None:
    soon = utc_now() + timedelta(hours=1)
    repo.commit(expires={"timestamp": soon, "snapshot": soon, "targets": soon})
    clock = FakeClock()
    device = make_device(tmp_path, repo, clock=clock)
    device.client.refresh()
    clock.now = soon + timedelta(hours=1)  # the cached copies have expired
    published = repo.publish_bundle("det", 1)
    repo.commit(
        expires=dict.fromkeys(("timestamp", "snapshot", "targets"), soon + timedelta(days=2))
    )

    device.client.refresh()
    assignment = device.client.check_directive(
        repo.directive(published, counter=1, expires=soon + timedelta(days=1))
    )

    assert (
        load_bundle(device.client.download_bundle(assignment, tmp_path / "b")).manifest.release == 1
    )


# -- 7: mix and match --------------------------------------------------------------------------


def test_attack_07_a_model_file_of_another_release_is_rejected(
    tmp_path: Path, repo: TufRepo
) -> None:
    v1 = repo.publish_bundle("det", 1, model=b"model one")
    # Release 2's manifest lists release 1's model; its target is release 1's entry.
    manifest = manifest_for("det", 2, {"onnx": ("model.onnx", v1.files["model.onnx"])})
    custom2 = {"bundle": "det", "version": "1.0.0", "release": 2, "profiles": []}
    repo.add_target("bundles/det/2/manifest.json", manifest, custom2)
    old = repo.targets.signed.targets["bundles/det/1/model.onnx"]
    repo.add_target("bundles/det/2/model.onnx", v1.files["model.onnx"], dict(old.custom))
    repo.commit()
    device = make_device(tmp_path, repo)
    assignment = device.client.check_directive(
        repo.directive("bundles/det/2/manifest.json", counter=1)
    )

    with pytest.raises(BundleRejected, match="release 1, not 'det' release 2"):
        device.client.download_bundle(assignment, tmp_path / "slot-b")

    assert not (tmp_path / "slot-b").exists()


def test_attack_07_a_manifest_of_another_release_is_rejected(tmp_path: Path, repo: TufRepo) -> None:
    v1 = repo.publish_bundle("det", 1)
    custom2 = {"bundle": "det", "version": "1.0.0", "release": 2, "profiles": []}
    repo.add_target("bundles/det/2/manifest.json", v1.files["manifest.json"], custom2)
    repo.add_target("bundles/det/2/model.onnx", v1.files["model.onnx"], custom2)
    repo.commit()
    device = make_device(tmp_path, repo)
    assignment = device.client.check_directive(
        repo.directive("bundles/det/2/manifest.json", counter=1)
    )

    with pytest.raises(BundleRejected, match="the manifest says det release 1"):
        device.client.download_bundle(assignment, tmp_path / "slot-b")

    assert not (tmp_path / "slot-b").exists()


def test_attack_07_a_directive_hash_that_differs_from_the_repository_is_refused(
    tmp_path: Path, repo: TufRepo
) -> None:
    v1 = repo.publish_bundle("det", 1)
    v2 = repo.publish_bundle("det", 2)
    device = make_device(tmp_path, repo)
    other = repo.targets.signed.targets[v1.manifest_path]

    with pytest.raises(DirectiveRefused, match="differ from the repository"):
        device.client.check_directive(repo.directive(v2, counter=1, target=other))


# -- 8: another device or hardware class -------------------------------------------------------


@pytest.mark.parametrize(
    ("device_id", "hardware_class", "match"),
    [("cam-02", "x86-gateway", "for device 'cam-02'"), ("cam-01", "jetson-orin", "hardware")],
)
def test_attack_08_directive_for_another_device_or_hardware_class_is_refused(
    tmp_path: Path, repo: TufRepo, device_id: str, hardware_class: str, match: str
) -> None:
    published = repo.publish_bundle("det", 1)
    device = make_device(tmp_path, repo, device_id="cam-01", hardware_class="x86-gateway")
    directive = repo.directive(
        published, counter=1, device_id=device_id, hardware_class=hardware_class
    )

    with pytest.raises(DirectiveRefused, match=match):
        device.client.check_directive(directive)


# -- 9: endless data ---------------------------------------------------------------------------


def test_attack_09_endless_data_stops_at_the_signed_length(tmp_path: Path, repo: TufRepo) -> None:
    published = repo.publish_bundle("det", 1, model=b"M" * 1000)
    target = repo.targets.signed.targets["bundles/det/1/model.onnx"]
    repo.target_file(target).write_bytes(b"M" * 1000 + b"\0" * (8 << 20))
    fetcher = LocalDirFetcher(repo.dir)
    device = make_device(tmp_path, repo, fetcher=fetcher)
    assignment = device.client.check_directive(repo.directive(published, counter=1))
    read_before = fetcher.bytes_read

    with pytest.raises(FetchFailed, match="exceeding the maximum allowed length of 1000"):
        device.client.download_bundle(assignment, tmp_path / "slot-b")

    manifest_len = len(published.files["manifest.json"])
    assert fetcher.bytes_read - read_before <= manifest_len + 256 * 1024  # one chunk, no more
    assert not (tmp_path / "slot-b").exists()


# -- 10: root rotation -------------------------------------------------------------------------


def test_attack_10_root_rotation_signed_by_old_and_new_keys_is_accepted(
    tmp_path: Path, repo: TufRepo
) -> None:
    device = make_device(tmp_path, repo)
    device.client.refresh()
    new_root, new_timestamp = [new_key()], [new_key()]
    old = repo.rotate_root("root", new_root)
    repo.rotate_root("timestamp", new_timestamp)  # in the same new version (2)
    repo.root.signed.version = 2
    repo.write_root(signers=old + new_root)
    published = repo.publish_bundle("det", 1)

    device.client.refresh()

    assert (device.trust_dir / "root.json").resolve().name == "2.root.json"
    assert device.client.check_directive(repo.directive(published, counter=1)).release == 1


def test_attack_10_a_skipped_root_version_is_rejected(tmp_path: Path, repo: TufRepo) -> None:
    device = make_device(tmp_path, repo)
    device.client.refresh()
    new_timestamp = [new_key()]
    repo.rotate_root("timestamp", new_timestamp)
    repo.write_root()  # v2
    repo.root.signed.version += 1
    repo.write_root()  # v3
    (repo.metadata_dir / "2.root.json").unlink()
    repo.commit()

    with pytest.raises(MetadataRejected, match="timestamp was signed by 0/1"):
        device.client.refresh()

    assert (device.trust_dir / "root.json").resolve().name == "1.root.json"


def test_attack_10_a_wrongly_signed_intermediate_root_is_rejected(
    tmp_path: Path, repo: TufRepo
) -> None:
    device = make_device(tmp_path, repo)
    device.client.refresh()
    new_root = [new_key()]
    repo.rotate_root("root", new_root)
    repo.write_root(signers=new_root)  # v2 without the old root key
    repo.root.signed.version += 1
    repo.write_root(signers=new_root)  # v3, properly signed by v2's keys

    with pytest.raises(MetadataRejected, match="root was signed by 0/1"):
        device.client.refresh()

    assert not (device.trust_dir / "root_history" / "2.root.json").exists()
    assert (device.trust_dir / "root.json").resolve().name == "1.root.json"


# -- 11: the device's trust root ---------------------------------------------------------------


def _strip_signatures(data: bytes) -> bytes:
    doc = json.loads(data)
    doc["signatures"] = []
    return json.dumps(doc).encode()


def _signed_by_another_key(data: bytes) -> bytes:
    md = Metadata[Root].from_bytes(data)
    md.sign(new_key())
    return md.to_bytes()


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda data: data[: len(data) // 2],
        _strip_signatures,
        _signed_by_another_key,
        lambda data: b"",
    ],
    ids=["truncated", "unsigned", "signed-by-another-key", "empty"],
)
def test_attack_11_corrupt_or_unsigned_trust_root_refuses_and_fetches_nothing(
    tmp_path: Path, repo: TufRepo, corrupt: Any
) -> None:
    repo.publish_bundle("det", 1)
    fetcher = LocalDirFetcher(repo.dir)
    device = make_device(tmp_path, repo, fetcher=fetcher)
    root = device.trust_dir / "root.json"
    root.write_bytes(corrupt(root.read_bytes()))
    before = tree_state(device.trust_dir)

    with pytest.raises(TrustRootError):
        device.client.refresh()

    assert fetcher.requests == 0
    assert tree_state(device.trust_dir) == before  # refused, never deleted


def test_attack_11_no_trust_root_at_all_refuses_and_fetches_nothing(
    tmp_path: Path, repo: TufRepo
) -> None:
    fetcher = LocalDirFetcher(repo.dir)
    device = make_device(tmp_path, repo, fetcher=fetcher, provision=False)

    with pytest.raises(TrustRootError, match="no trusted root"):
        device.client.refresh()

    assert fetcher.requests == 0


# -- 12: unknown fields are signed too ---------------------------------------------------------


def test_attack_12_unknown_fields_are_covered_by_the_signature(
    tmp_path: Path, repo: TufRepo
) -> None:
    device = make_device(tmp_path, repo)
    repo.timestamp.signed.unrecognized_fields["x-note"] = "signed"
    repo.commit()
    device.client.refresh()  # unknown but signed: accepted and kept
    repo.commit()
    repo.edit_json("timestamp.json", lambda d: d["signed"].update({"x-note": "added later"}))

    with pytest.raises(MetadataRejected, match="timestamp was signed by 0/1"):
        device.client.refresh()


def test_attack_12_unknown_directive_fields_are_covered_by_the_signature(
    tmp_path: Path, repo: TufRepo
) -> None:
    published = repo.publish_bundle("det", 1)
    device = make_device(tmp_path, repo)
    doc = json.loads(repo.directive(published, counter=1))
    doc["signed"]["custom"]["x-priority"] = "urgent"

    with pytest.raises(DirectiveRefused, match="not signed by the director"):
        device.client.check_directive(json.dumps(doc).encode())


# -- 13: partial bundle ------------------------------------------------------------------------


def test_attack_13_a_model_missing_from_the_repository_never_makes_a_bundle_dir(
    tmp_path: Path, repo: TufRepo
) -> None:
    published = repo.publish_bundle("det", 1, commit=False)
    del repo.targets.signed.targets["bundles/det/1/model.onnx"]
    repo.commit()
    device = make_device(tmp_path, repo)
    assignment = device.client.check_directive(repo.directive(published, counter=1))

    with pytest.raises(BundleRejected, match="partial bundle"):
        device.client.download_bundle(assignment, tmp_path / "slot-b")

    assert not (tmp_path / "slot-b").exists()


def test_attack_13_a_model_file_missing_on_the_server_never_makes_a_bundle_dir(
    tmp_path: Path, repo: TufRepo
) -> None:
    published = repo.publish_bundle("det", 1)
    repo.target_file(repo.targets.signed.targets["bundles/det/1/model.onnx"]).unlink()
    device = make_device(tmp_path, repo)
    assignment = device.client.check_directive(repo.directive(published, counter=1))

    with pytest.raises(FetchFailed, match="DownloadHTTPError"):
        device.client.download_bundle(assignment, tmp_path / "slot-b")

    assert not (tmp_path / "slot-b").exists()


# -- 14: replayed or expired directive ---------------------------------------------------------


def test_attack_14_replayed_directive_counter_is_refused(tmp_path: Path, repo: TufRepo) -> None:
    v1 = repo.publish_bundle("det", 1)
    v2 = repo.publish_bundle("det", 2)
    device = make_device(tmp_path, repo)
    older = repo.directive(v1, counter=4)
    applied = repo.directive(v2, counter=5)
    device.client.check_directive(applied)
    device.client.record_applied(5)

    with pytest.raises(RollbackRefused, match="counter 4 is not above 5"):
        device.client.check_directive(older)
    with pytest.raises(RollbackRefused, match="counter 5 is not above 5"):
        device.client.check_directive(repo.directive(v1, counter=5))  # same counter, other
    assert device.client.check_directive(applied).already_applied


def test_attack_14_expired_directive_is_refused(tmp_path: Path, repo: TufRepo) -> None:
    published = repo.publish_bundle("det", 1)
    device = make_device(tmp_path, repo)
    expired = repo.directive(published, counter=1, expires=utc_now() - timedelta(seconds=1))

    with pytest.raises(DirectiveRefused, match="expired"):
        device.client.check_directive(expired)


# -- 16: the clock -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "wrong_clock",
    [datetime(1970, 1, 1, tzinfo=timezone.utc), utc_now() - timedelta(days=30)],
    ids=["1970", "stepped-back"],
)
def test_attack_16_clock_set_back_cannot_revive_metadata_expired_before_the_floor(
    tmp_path: Path, repo: TufRepo, wrong_clock: datetime
) -> None:
    clock = FakeClock(utc_now() + timedelta(days=3))
    device = make_device(tmp_path, repo, clock=clock)
    device.client.refresh()  # floor: now + 3 days
    repo.publish_bundle("det", 1)
    repo.write_timestamp(expires=utc_now() + timedelta(days=2))  # expired before the floor
    clock.now = wrong_clock

    with pytest.raises(StaleMetadataError, match=r"timestamp\.json is expired"):
        device.restart().client.refresh()  # the floor survives a restart

    floor = device.floor.floor()
    assert floor > wrong_clock
    repo.write_timestamp(expires=utc_now() + timedelta(days=7))
    device.client.refresh()  # fresh metadata still installs: no lockout
    assert device.floor.floor() == floor  # and the wrong clock did not lower the floor


def test_attack_16_clock_set_back_cannot_revive_an_expired_directive(
    tmp_path: Path, repo: TufRepo
) -> None:
    published = repo.publish_bundle("det", 1)
    clock = FakeClock(utc_now() + timedelta(days=3))
    device = make_device(tmp_path, repo, clock=clock)
    device.client.refresh()
    directive = repo.directive(published, counter=1, expires=utc_now() + timedelta(days=1))
    clock.now = utc_now() - timedelta(days=1)  # the directive looks valid to this clock

    with pytest.raises(DirectiveRefused, match="expired"):
        device.client.check_directive(directive)


def test_attack_16_clock_ten_years_ahead_refuses_reports_stale_and_never_locks_out(
    tmp_path: Path, repo: TufRepo
) -> None:
    published = repo.publish_bundle("det", 1)
    clock = FakeClock()
    device = make_device(tmp_path, repo, clock=clock)
    device.client.refresh()
    floor = device.floor.floor()
    trusted = tree_state(device.trust_dir)
    repo.publish_bundle("det", 2)  # new metadata the device must not take in now
    clock.now = utc_now() + timedelta(days=3653)

    with pytest.raises(StaleMetadataError, match=r"root\.json is expired"):
        device.client.refresh()

    assert device.client.stale
    assert device.floor.floor() == floor  # a clock far ahead is not believed
    assert tree_state(device.trust_dir) == trusted  # nothing taken in, root kept
    clock.now = utc_now()  # the clock is fixed: updates work again
    device.client.refresh()
    assert device.client.check_directive(repo.directive(published, counter=1)).release == 1


# -- 17: installing what is installed ----------------------------------------------------------


def test_attack_17_installing_the_applied_directive_again_is_a_no_op(
    tmp_path: Path, repo: TufRepo
) -> None:
    published = repo.publish_bundle("det", 1)
    fetcher = LocalDirFetcher(repo.dir)
    device = make_device(tmp_path, repo, fetcher=fetcher)
    directive = repo.directive(published, counter=3)
    assignment = device.client.check_directive(directive)
    device.client.download_bundle(assignment, tmp_path / "slot-b")
    device.client.record_applied(assignment.counter)
    requests = fetcher.requests

    again = device.client.check_directive(directive)

    assert again.already_applied
    assert fetcher.requests == requests  # nothing fetched for it
