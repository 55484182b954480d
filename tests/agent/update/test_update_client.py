"""The update client on real signed TUF repositories (files on disk): refresh, directive,
verified download into a bundle directory, the directive counter, the time floor and the
local-directory fetcher."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from tuf.api.exceptions import DownloadError, DownloadHTTPError

from agent.kernel.bundle import load_bundle
from agent.update import (
    DirectiveRefused,
    LocalDirFetcher,
    RollbackRefused,
    StagingFailed,
    TimeFloor,
)
from agent.update.timefloor import EPOCH
from agent.update.trust import COUNTER_FILE
from tests.agent.update.tuf_repo import FakeClock, TufRepo, make_device, new_key, utc_now


@pytest.fixture
def repo(tmp_path: Path) -> TufRepo:
    return TufRepo(tmp_path / "repo")


def test_assigned_bundle_downloads_verified_and_loads(
    tmp_path: Path, repo: TufRepo, add_model: str
) -> None:
    model = Path(add_model).read_bytes()
    published = repo.publish_bundle("adder", 3, model=model, version="1.4.0")
    device = make_device(tmp_path, repo)

    device.client.refresh()
    assignment = device.client.check_directive(repo.directive(published, counter=1))
    bundle_dir = device.client.download_bundle(assignment, tmp_path / "slot-b")

    assert (assignment.name, assignment.release, assignment.version) == ("adder", 3, "1.4.0")
    assert not assignment.already_applied
    assert sorted(p.name for p in bundle_dir.iterdir()) == ["manifest.json", "model.onnx"]
    bundle = load_bundle(bundle_dir)
    assert bundle.manifest.release == 3
    assert bundle.model_file("onnx").read_bytes() == model


def test_refresh_caches_verified_metadata_and_raises_the_time_floor(
    tmp_path: Path, repo: TufRepo
) -> None:
    clock = FakeClock(utc_now() + timedelta(hours=5))
    device = make_device(tmp_path, repo, clock=clock)
    assert device.floor.floor() == EPOCH

    device.client.refresh()

    names = {p.name for p in device.trust_dir.iterdir()}
    assert {"root.json", "timestamp.json", "snapshot.json", "targets.json"} <= names
    assert device.floor.floor() == clock.now
    assert TimeFloor(device.floor.path).floor() == clock.now  # persisted


def test_applied_directive_is_a_no_op_after_a_restart(tmp_path: Path, repo: TufRepo) -> None:
    published = repo.publish_bundle("det", 1)
    device = make_device(tmp_path, repo)
    directive = repo.directive(published, counter=7)
    assignment = device.client.check_directive(directive)
    device.client.record_applied(assignment.counter)

    again = device.restart().client.check_directive(directive)

    assert again.already_applied
    assert again.counter == 7
    stored = json.loads((device.trust_dir / COUNTER_FILE).read_text())
    assert stored == {"counter": 7, "digest": assignment.digest}


def test_a_newer_directive_for_the_installed_release_is_already_applied(
    tmp_path: Path, repo: TufRepo
) -> None:
    published = repo.publish_bundle("det", 4)
    device = make_device(tmp_path, repo)

    assignment = device.client.check_directive(
        repo.directive(published, counter=2), installed_name="det", installed_release=4
    )

    assert assignment.already_applied


def test_a_higher_release_of_the_installed_bundle_is_assigned(
    tmp_path: Path, repo: TufRepo
) -> None:
    repo.publish_bundle("det", 4)
    newer = repo.publish_bundle("det", 5)
    device = make_device(tmp_path, repo)

    assignment = device.client.check_directive(
        repo.directive(newer, counter=1), installed_name="det", installed_release=4
    )

    assert not assignment.already_applied
    assert assignment.release == 5


def test_record_applied_never_lowers_the_counter(tmp_path: Path, repo: TufRepo) -> None:
    device = make_device(tmp_path, repo)
    device.client.record_applied(9, "a" * 64)
    device.client.record_applied(3, "b" * 64)
    assert device.client.applied_counter() == 9


def test_unreadable_counter_file_falls_back_to_zero_loudly(tmp_path: Path, repo: TufRepo) -> None:
    published = repo.publish_bundle("det", 1)
    device = make_device(tmp_path, repo)
    (device.trust_dir / COUNTER_FILE).write_text("{not json")

    assignment = device.client.check_directive(repo.directive(published, counter=1))

    assert assignment.counter == 1
    assert device.client._counter.unreadable >= 1


def test_staging_dir_that_holds_files_is_refused_and_kept(tmp_path: Path, repo: TufRepo) -> None:
    published = repo.publish_bundle("det", 1)
    device = make_device(tmp_path, repo)
    assignment = device.client.check_directive(repo.directive(published, counter=1))
    staging = tmp_path / "slot-b"
    staging.mkdir()
    (staging / "old.txt").write_text("keep me")

    with pytest.raises(StagingFailed, match="not empty"):
        device.client.download_bundle(assignment, staging)

    assert (staging / "old.txt").read_text() == "keep me"


def test_bundle_for_another_firmware_profile_is_refused(tmp_path: Path, repo: TufRepo) -> None:
    published = repo.publish_bundle("det", 1, profiles=["jetson-orin"])
    device = make_device(tmp_path, repo, hardware_class="x86-gateway")

    with pytest.raises(DirectiveRefused, match="profiles"):
        device.client.check_directive(repo.directive(published, counter=1))


def test_rotated_director_key_replaces_the_old_one(tmp_path: Path, repo: TufRepo) -> None:
    published = repo.publish_bundle("det", 1)
    old = repo.signers["director"]
    new = [new_key()]
    targets = repo.targets.signed
    targets.revoke_key(old[0].public_key.keyid, "director")
    targets.add_key(new[0].public_key, "director")
    repo.signers["director"] = new
    repo.commit()
    device = make_device(tmp_path, repo)

    with pytest.raises(DirectiveRefused, match="not signed by the director"):
        device.client.check_directive(repo.directive(published, counter=1, signers=old))
    assert device.client.check_directive(repo.directive(published, counter=2)).counter == 2


def test_missing_root_json_is_restored_from_root_history(tmp_path: Path, repo: TufRepo) -> None:
    device = make_device(tmp_path, repo)
    device.client.refresh()
    (device.trust_dir / "root.json").unlink()  # power lost while the ngclient relinked it

    device.restart().client.refresh()

    assert (device.trust_dir / "root.json").resolve().name == "1.root.json"


def test_rollback_refusal_names_the_releases(tmp_path: Path, repo: TufRepo) -> None:
    published = repo.publish_bundle("det", 2)
    device = make_device(tmp_path, repo)

    with pytest.raises(RollbackRefused) as info:
        device.client.check_directive(
            repo.directive(published, counter=1), installed_name="det", installed_release=6
        )

    assert info.value.step == "directive"
    assert "release 2 of det is below the installed 6" in info.value.reason


# -- the time floor -----------------------------------------------------------------------


def test_time_floor_only_moves_up_and_is_durable(tmp_path: Path) -> None:
    clock = FakeClock(EPOCH - timedelta(days=10000))
    floor = TimeFloor(tmp_path / "floor.json", clock=clock)
    assert floor.now() == EPOCH
    later = utc_now()
    floor.raise_to(later)
    floor.raise_to(later - timedelta(days=1))

    assert TimeFloor(tmp_path / "floor.json", clock=clock).floor() == later
    assert floor.now() == later
    assert floor.clock_behind()


def test_corrupt_time_floor_falls_back_to_the_epoch_without_raising(tmp_path: Path) -> None:
    path = tmp_path / "floor.json"
    path.write_text('{"floor": "yesterday"}')
    floor = TimeFloor(path, clock=FakeClock(EPOCH - timedelta(days=1)))

    assert floor.now() == EPOCH
    assert floor.unreadable == 1


# -- the local-directory fetcher -------------------------------------------------------------


def test_local_dir_fetcher_reads_repository_files_in_chunks(tmp_path: Path) -> None:
    (tmp_path / "targets").mkdir()
    data = os.urandom(600_000)
    (tmp_path / "targets" / "big.bin").write_bytes(data)
    fetcher = LocalDirFetcher(tmp_path)

    chunks = list(fetcher.fetch("edgefleet:/targets/big.bin"))

    assert b"".join(chunks) == data
    assert max(len(c) for c in chunks) <= 256 * 1024
    assert hashlib.sha256(b"".join(chunks)).digest() == hashlib.sha256(data).digest()


@pytest.mark.parametrize(
    "url",
    [
        "edgefleet:/../secret",
        "edgefleet:/metadata/../../secret",
        "edgefleet://etc/passwd",
        "edgefleet:/keys/root.key",
        "https://example.org/metadata/root.json",
    ],
)
def test_local_dir_fetcher_refuses_paths_outside_the_repository(tmp_path: Path, url: str) -> None:
    (tmp_path / "metadata").mkdir()
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "root.key").write_text("secret")
    (tmp_path.parent / "secret").write_text("secret")

    with pytest.raises(DownloadError) as info:
        b"".join(LocalDirFetcher(tmp_path).fetch(url))

    assert not isinstance(info.value, DownloadHTTPError)


def test_local_dir_fetcher_refuses_a_link_out_of_the_repository(tmp_path: Path) -> None:
    (tmp_path / "targets").mkdir()
    (tmp_path / "outside.bin").write_bytes(b"x")
    (tmp_path / "targets" / "link.bin").symlink_to(tmp_path / "outside.bin")

    with pytest.raises(DownloadError, match="outside"):
        b"".join(LocalDirFetcher(tmp_path).fetch("edgefleet:/targets/link.bin"))


def test_local_dir_fetcher_answers_404_for_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "metadata").mkdir()

    with pytest.raises(DownloadHTTPError) as info:
        b"".join(LocalDirFetcher(tmp_path).fetch("edgefleet:/metadata/2.root.json"))

    assert info.value.status_code == 404
