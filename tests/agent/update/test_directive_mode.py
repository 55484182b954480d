"""The directive's mode (custom.mode, signed): ``active`` by default, ``shadow`` carried to
the assignment, anything else refused; the counter rules are the same for both modes."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.update import DirectiveRefused, RollbackRefused
from agent.update.directive import MODE_ACTIVE, MODE_SHADOW, verify_directive
from tests.agent.update.tuf_repo import TufRepo, make_device


@pytest.fixture
def repo(tmp_path: Path) -> TufRepo:
    return TufRepo(tmp_path / "repo")


def test_a_directive_without_a_mode_is_active(tmp_path: Path, repo: TufRepo) -> None:
    published = repo.publish_bundle("det", 1)
    device = make_device(tmp_path, repo)

    a = device.client.check_directive(repo.directive(published, counter=1))

    assert (a.mode, a.shadow) == (MODE_ACTIVE, False)


def test_a_shadow_directive_carries_its_mode_to_the_assignment(
    tmp_path: Path, repo: TufRepo
) -> None:
    published = repo.publish_bundle("det", 2)
    device = make_device(tmp_path, repo)

    a = device.client.check_directive(repo.directive(published, counter=1, mode="shadow"))

    assert (a.mode, a.shadow, a.release) == (MODE_SHADOW, True, 2)
    device.client.record_applied(a.counter)
    again = device.client.check_directive(repo.directive(published, counter=1, mode="shadow"))
    assert again.already_applied
    assert again.mode == MODE_SHADOW


@pytest.mark.parametrize("mode", ["canary", "Shadow", "", 0, ["shadow"], {"m": "shadow"}])
def test_an_unknown_mode_is_refused_even_when_signed(
    tmp_path: Path, repo: TufRepo, mode: object
) -> None:
    published = repo.publish_bundle("det", 1)
    device = make_device(tmp_path, repo)
    directive = repo.directive(published, counter=1, mode=mode)
    targets = repo.targets.signed

    with pytest.raises(DirectiveRefused, match=r"custom\.mode"):
        verify_directive(directive, targets, device_id="cam-01", hardware_class="x86-gateway")
    with pytest.raises(DirectiveRefused, match=r"custom\.mode"):
        device.client.check_directive(directive)


def test_the_mode_is_signed_a_changed_mode_is_refused(tmp_path: Path, repo: TufRepo) -> None:
    published = repo.publish_bundle("det", 1)
    device = make_device(tmp_path, repo)
    directive = repo.directive(published, counter=1)
    tampered = directive.replace(b'"device_id"', b'"mode":"shadow","device_id"', 1)
    assert tampered != directive

    with pytest.raises(DirectiveRefused, match="not signed by the director"):
        device.client.check_directive(tampered)


def test_counters_are_one_sequence_across_modes(tmp_path: Path, repo: TufRepo) -> None:
    published = repo.publish_bundle("det", 1)
    newer = repo.publish_bundle("det", 2)
    device = make_device(tmp_path, repo)
    shadow = device.client.check_directive(repo.directive(newer, counter=5, mode="shadow"))
    device.client.record_applied(shadow.counter)

    with pytest.raises(RollbackRefused, match="not above 5"):
        device.client.check_directive(repo.directive(newer, counter=4))
    with pytest.raises(RollbackRefused, match="not above 5"):
        device.client.check_directive(repo.directive(published, counter=5, mode="shadow"))
    assert device.client.check_directive(repo.directive(newer, counter=6)).mode == MODE_ACTIVE
