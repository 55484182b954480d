"""The [alerts] configuration: errors name the field, a rule can't route to a webhook that
is not configured, and a webhook's secret comes from the credentials directory or the
environment only: ``fleet-server check-config`` (a process) and the start of the server
refuse one that is missing or short, naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.kernel.errors import ConfigError
from fleet_server.alerts.runner import AlertRunner
from fleet_server.config import parse_config
from fleet_server.db import sqlite_url
from fleet_server.errors import FleetError
from fleet_server.serve import FleetServer
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    api_config,
    make_repository,
)

BIN = Path(sys.executable).parent
SECRET_ENV = "EDGEFLEET_WEBHOOK_OPS"  # noqa: S105 (a variable name)
HOOK = {"name": "ops", "url": "https://hooks.example.com/x", "secret_env": SECRET_ENV}


@pytest.mark.parametrize(
    ("alerts", "field", "says"),
    [
        ({"rules": {"drift": {"webhooks": ["pager"]}}, "webhooks": [HOOK]}, "alerts",
         "rules.drift.webhooks names ['pager'], not a webhook"),
        ({"webhooks": [HOOK, HOOK]}, "alerts", "webhook name(s) ['ops'] used more than once"),
        ({"webhooks": [{**HOOK, "url": "ftp://x"}]}, "alerts.webhooks[0].url",
         "is not an http:// or https:// URL"),
        ({"webhooks": [{**HOOK, "url": "https://user:pw@x/"}]}, "alerts.webhooks[0].url",
         "must not hold a user or password"),
        ({"webhooks": [{**HOOK, "secret": "in clear"}]}, "alerts.webhooks[0].secret",
         "unknown key"),
        ({"webhooks": [{**HOOK, "rules": ["offline"]}]}, "alerts.webhooks[0].rules",
         "unknown rule(s) ['offline']"),
        ({"rules": {"device_offline": {"after_minutes": 0}}},
         "alerts.rules.device_offline.after_minutes", "greater than 0"),
        ({"rules": {"no_such_rule": {}}}, "alerts.rules.no_such_rule", "unknown key"),
    ],
)  # fmt: skip
def test_a_bad_alerts_section_is_refused_naming_the_field(
    alerts: dict[str, object], field: str, says: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"alerts": alerts}, "fleet.toml")
    assert info.value.field == field
    assert says in str(info.value)


def _check(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "fleet-server"), "check-config", "--config", str(config), "--json"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip


def test_check_config_refuses_a_missing_or_short_secret_and_takes_a_credential(
    tmp_path: Path,
) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text(
        f'[[alerts.webhooks]]\nname = "ops"\nurl = "https://hooks.example.com/x"\n'
        f'secret_env = "{SECRET_ENV}"\n'
    )
    env = {k: v for k, v in os.environ.items() if k not in (SECRET_ENV, "CREDENTIALS_DIRECTORY")}
    missing = _check(config, env)
    assert missing.returncode == 2
    assert f"the webhook secret ${SECRET_ENV} is not set" in missing.stderr
    short = _check(config, env | {SECRET_ENV: "too short"})
    assert short.returncode == 2
    assert "has 9 characters; at least 16 are needed" in short.stderr
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / SECRET_ENV).write_text("a webhook key of enough characters\n")
    ok = _check(config, env | {"CREDENTIALS_DIRECTORY": str(creds)})
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)["alerts"]
    assert report["webhooks"] == [
        {"name": "ops", "url": "https://hooks.example.com/x", "secret_env": SECRET_ENV}
    ]
    assert "device_offline" in report["rules"]


def test_the_server_does_not_start_without_a_webhooks_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    repo, keys = make_repository(tmp_path / "repo")
    base = api_config(tmp_path / "state", repo, keys, db_url=sqlite_url(tmp_path / "f.db"))
    config = base.model_copy(update={"alerts": base.alerts.model_validate({"webhooks": [HOOK]})})
    server = FleetServer(config, services=[AlertRunner])
    with pytest.raises(FleetError, match=f"webhook secret \\${SECRET_ENV} is not set"):
        server.start()
