"""packaging/compose/: the compose file names the image ``make image`` builds, gives every
service a healthcheck, maps every secret to a file ``secrets.sh`` writes, and publishes the
ports its fleet.toml (which fleet-server accepts) listens on."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]
VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]  # type: ignore[index]


COMPOSE = ROOT / "packaging" / "compose"


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((COMPOSE / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_the_stack_is_fleet_server_on_this_version_and_postgres() -> None:
    services = _compose()["services"]
    assert set(services) == {"fleet-server", "postgres"}
    assert services["fleet-server"]["image"] == f"edgefleet-server:{VERSION}"
    assert services["postgres"]["image"].startswith("postgres:")
    assert services["fleet-server"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name, service in services.items():
        assert service["healthcheck"]["test"][0] == "CMD", f"{name} has no healthcheck"


def test_secrets_are_files_under_run_secrets_that_secrets_sh_writes() -> None:
    compose = _compose()
    script = (COMPOSE / "secrets.sh").read_text()
    written = set(re.findall(r"secrets/([A-Za-z_]+)", script))
    for name, secret in compose["secrets"].items():
        assert secret["file"] == f"./secrets/{name}"
        assert name in written, f"secrets.sh does not write secrets/{name}"
    server = compose["services"]["fleet-server"]
    assert server["environment"]["CREDENTIALS_DIRECTORY"] == "/run/secrets"
    assert server["environment"]["PGPASSFILE"] == "/run/secrets/pgpass"
    used = {*server["secrets"], *compose["services"]["postgres"]["secrets"]}
    assert used == set(compose["secrets"])
    config = tomllib.loads((COMPOSE / "fleet.toml").read_text())
    assert config["http"]["operator_token_env"] in server["secrets"]


def test_published_ports_are_the_ones_fleet_toml_listens_on() -> None:
    server = _compose()["services"]["fleet-server"]
    config = tomllib.loads((COMPOSE / "fleet.toml").read_text())
    ports = {config["http"]["port"], config["broker"]["mosquitto"]["port"]}
    published = {int(p.split(":")[1]) for p in server["ports"]}
    assert published == ports
    assert "postgres" in config["database"]["url"]
    assert ":" not in config["database"]["url"].split("@")[0].split("//")[1], "password in URL"


def test_fleet_server_accepts_the_compose_fleet_toml() -> None:
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "fleet-server"),
            "check-config",
            "--config",
            str(COMPOSE / "fleet.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "managed broker 0.0.0.0:8883" in done.stdout


def test_secrets_sh_is_valid_shell() -> None:
    done = subprocess.run(
        ["sh", "-n", str(COMPOSE / "secrets.sh")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
