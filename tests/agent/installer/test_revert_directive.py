"""A device set up with a bundle (run from its configured directory, in no slot) reports
it as active, and the fleet's signed ``revert`` directive brings it back to that release
after a newer one was installed: fetched, verified and installed like any assign, though
it is below the committed release. An ``active`` directive for the same lower release is
still refused (rollback protection)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentConfig, parse_config
from agent.directives.link import apply_directive, make_client
from agent.directives.report import configured_bundles, reported_state
from agent.installer import Installer
from agent.kernel.bundle import load_bundle
from agent.update.fetchers import LocalDirFetcher
from fleet_server.repository import KeyStore, Repository
from fleet_server.repository.director import issue_directive
from runtime import PoolConfig
from runtime.profiles import load_profile
from tests.agent.installer.installer_helpers import PROFILE, make_bundle

DEVICE = "gw-revert-1"


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[KeyStore, Repository, Path]:
    """A repository with cls releases 1 and 2; returns the directory of release 1 too
    (what the device was set up with)."""
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", "test passphrase, made at test time")
    keys = KeyStore.create(tmp_path / "keys", root_keys=1, root_threshold=1)
    repo = Repository(tmp_path / "repo")
    repo.init(keys)
    first = make_bundle(tmp_path, name="cls", version="1.1.0", release=1)
    repo.publish(first.path, keys)
    repo.publish(make_bundle(tmp_path, name="cls", version="1.2.0", release=2).path, keys)
    return keys, repo, first.path


def _config(tmp_path: Path, repo: Repository, set_up: Path) -> AgentConfig:
    return parse_config(
        {
            "agent": {"device_id": DEVICE, "state_dir": str(tmp_path / "state"),
                      "profile": PROFILE},
            "cameras": [{"name": "c1", "kind": "synthetic", "fps": 5, "pattern": "bars"}],
            "pipelines": [{"name": "p", "source": "c1", "installed": "cls",
                           "bundle": str(set_up)}],
            "bundles": {
                "enabled": True,
                "initial_root": str(repo.path / "metadata" / "1.root.json"),
                "installer": {"health_window_s": 0.5, "health_poll_s": 0.1, "benchmark_runs": 5},
            },
        }
    )  # fmt: skip


def _apply(cfg: AgentConfig, installer: Installer, repo: Repository, directive: bytes) -> Any:
    client = make_client(
        cfg.bundles, cfg.agent.state_dir, LocalDirFetcher(repo.path), device_id=DEVICE, hw=PROFILE
    )
    return apply_directive(
        client, installer, directive, staging_root=cfg.agent.state_dir / "staging", source="test"
    )


def test_the_set_up_bundle_is_reported_and_a_revert_directive_brings_the_device_back_to_it(
    tmp_path: Path, fleet: tuple[KeyStore, Repository, Path]
) -> None:
    keys, repo, set_up = fleet
    cfg = _config(tmp_path, repo, set_up)
    profile = load_profile(PROFILE)
    installer = Installer(
        cfg.agent.state_dir,
        profile_name=profile.name,
        config=cfg.bundles.installer,
        pool_config=PoolConfig.from_profile(profile, workers=1, pin=False),
    )
    configured = configured_bundles(cfg)
    assert configured == {"cls": set_up}
    state = reported_state(PROFILE, installer, {}, configured)
    assert state["active"] == {
        "name": "cls",
        "version": "1.1.0",
        "release": 1,
        "digest": load_bundle(set_up).digest,
    }
    assert "previous" not in state

    def directive(release: int, mode: str = "active") -> bytes:
        return issue_directive(repo, keys, DEVICE, PROFILE, "cls", release, mode=mode)

    assert _apply(cfg, installer, repo, directive(2))["outcome"] == "committed"
    assert reported_state(PROFILE, installer, {}, configured)["active"]["release"] == 2

    # an active directive for the lower release is still refused: rollback protection
    refused = _apply(cfg, installer, repo, directive(1))
    assert (refused["outcome"], refused["step"]) == ("failed", "plan")
    assert "rollback protection" in refused["reason"]
    assert installer.committed("cls").release == 2  # type: ignore[union-attr]

    reverted = _apply(cfg, installer, repo, directive(1, "revert"))
    assert (reverted["outcome"], reverted["mode"]) == ("committed", "revert"), reverted
    committed = installer.committed("cls")
    assert committed is not None
    assert (committed.release, committed.digest) == (1, load_bundle(set_up).digest)
    state = reported_state(PROFILE, installer, {}, configured)
    assert (state["active"]["release"], state["previous"]["release"]) == (1, 2)

    # the same revert again: nothing to do
    again = _apply(cfg, installer, repo, directive(1, "revert"))
    assert again["outcome"] == "noop"


def test_a_configured_directory_that_does_not_load_is_not_reported(
    tmp_path: Path, fleet: tuple[KeyStore, Repository, Path]
) -> None:
    _, repo, set_up = fleet
    cfg = _config(tmp_path, repo, set_up)
    installer = Installer(cfg.agent.state_dir, profile_name=PROFILE, config=cfg.bundles.installer)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    assert "active" not in reported_state(PROFILE, installer, {}, {"cls": broken})
    other = make_bundle(tmp_path, name="det", version="1.0.0", release=1).path
    assert "active" not in reported_state(PROFILE, installer, {}, {"cls": other})
