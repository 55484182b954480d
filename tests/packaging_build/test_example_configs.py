"""The commented example configs the packages ship (packaging/etc/): every key of the
schema is there, explained, and the file is a valid config both as shipped (all
commented) and uncommented, read by the real loaders and ``check-config``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from agent.config import AgentConfig, parse_config
from agent.kernel.toml import parse_toml
from fleet_server.config import FleetServerConfig
from fleet_server.config import parse_config as parse_fleet_config
from tests.packaging_build.conftest import ROOT

ETC = ROOT / "packaging" / "etc"
AGENT = ETC / "agent.toml.example"
FLEET = ETC / "fleet.toml.example"
BIN = Path(sys.executable).parent


def uncomment(text: str) -> str:
    """The settings of an example made live: ``# `` taken off; ``##`` explanations stay."""
    return "\n".join(line[2:] if line.startswith("# ") else line for line in text.splitlines())


def schema_keys(model: type[BaseModel]) -> set[str]:
    """Every leaf key of ``model`` (dotted; a list of tables and a table of tables add
    no index or name)."""
    keys: set[str] = set()

    def models(annotation: object) -> list[type[BaseModel]]:
        found: list[type[BaseModel]] = []
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        for arg in typing.get_args(annotation):
            found += models(arg)
        return found

    def walk(m: type[BaseModel], prefix: str) -> None:
        for name, info in m.model_fields.items():
            subs = models(info.annotation)
            if subs:
                for sub in subs:
                    walk(sub, f"{prefix}{name}.")
            else:
                keys.add(prefix + name)

    walk(model, "")
    return keys


def example_keys(text: str) -> set[str]:
    """The dotted keys the example sets (live when uncommented) or shows indented in an
    explanation (``##   key = ...``: an alternative), with table names as the schema has
    them (a table of tables' own name left out)."""
    keys: set[str] = set()
    table = ""
    for line in text.splitlines():
        body = re.sub(r"^(# |##   )", "", line)
        if body == line:
            continue
        header = re.fullmatch(r"\[\[?([A-Za-z0-9_.]+)\]\]?", body)
        if header:
            table = header[1]
            continue
        found = re.match(r"([A-Za-z_][A-Za-z0-9_]*) = ", body)
        if found:
            keys.add(f"{table}.{found[1]}" if table else found[1])
    return {re.sub(r"^lines\.[^.]+\.", "lines.", k) for k in keys}


@pytest.mark.parametrize(("path", "model"), [(AGENT, AgentConfig), (FLEET, FleetServerConfig)])
def test_every_key_of_the_schema_is_in_the_example_and_no_other(
    path: Path, model: type[BaseModel]
) -> None:
    schema = schema_keys(model)
    shown = example_keys(path.read_text())
    assert not schema - shown, f"{path.name} lacks {sorted(schema - shown)}"
    assert not shown - schema, f"{path.name} has keys the schema lacks: {sorted(shown - schema)}"


@pytest.mark.parametrize("path", [AGENT, FLEET])
def test_every_setting_has_an_explanation_above_it(path: Path) -> None:
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"# [A-Za-z_]+ = ", line):
            assert lines[i - 1].startswith("## "), f"{path.name}:{i + 1}: {line} unexplained"


def test_the_agent_example_uncommented_is_a_valid_config(tmp_path: Path) -> None:
    text = uncomment(AGENT.read_text())
    cfg = parse_config(parse_toml(text, str(AGENT)), str(AGENT))
    assert cfg.agent.state_dir == Path("/var/lib/edgefleet/agent")
    assert [c.name for c in cfg.cameras] == ["cam0"]
    assert [a.kind for a in cfg.actions.actions] == ["mqtt", "webhook"]
    live = tmp_path / "agent.toml"
    live.write_text(text)
    done = subprocess.run(
        [str(BIN / "edge-agent"), "check-config", "--config", str(live), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = json.loads(done.stdout)
    assert report["pipelines"] == ["line1-cam0"]
    # what check-config finds beyond the loader is only that the example's bundle
    # directories do not exist on this machine
    assert report["problems"], done.stderr
    for problem in report["problems"]:
        assert "/srv/edgefleet/bundles/" in problem, problem


@pytest.mark.parametrize(("path", "command"), [(AGENT, "edge-agent"), (FLEET, "fleet-server")])
def test_the_example_as_shipped_passes_check_config(path: Path, command: str) -> None:
    done = subprocess.run(
        [str(BIN / command), "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_fleet_example_uncommented_passes_check_config(tmp_path: Path) -> None:
    live = tmp_path / "fleet.toml"
    live.write_text(uncomment(FLEET.read_text()))
    done = subprocess.run(
        [str(BIN / "fleet-server"), "check-config", "--config", str(live), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)


def _alternative(lines: list[str], header: str) -> list[str]:
    """``lines`` with the explained alternative ``##   [header]`` block made live (up to
    the next line that is not part of it)."""
    out, inside = [], False
    for line in lines:
        if line in (f"##   [{header}]", f"##   [[{header}]]"):
            inside = True
        elif inside and not line.startswith("## "):
            inside = False
        out.append(line[5:] if inside and line.startswith("##   ") else line)
    return out


def test_the_fleet_examples_external_broker_is_a_valid_alternative() -> None:
    text = FLEET.read_text()
    text = text.replace("# managed = true", "# managed = false")
    alt = [re.sub(r"^##   ", "", ln) for ln in text.splitlines() if ln.startswith("##   [broker")]
    assert alt == ["[broker.external]", "[broker.shards.external]"]
    lines = _alternative(text.splitlines(), "broker.external")
    cfg = parse_fleet_config(parse_toml(uncomment("\n".join(lines)), str(FLEET)), str(FLEET))
    assert cfg.broker.external is not None
    assert cfg.broker.external.host == "mqtt.example.com"


def test_the_fleet_examples_shard_is_a_valid_alternative() -> None:
    lines = FLEET.read_text().splitlines()
    first = lines.index("##   [[broker.shards]]")
    last = lines.index("##   [broker.shards.external]")
    shard = [ln[5:] for ln in lines[first:last] if ln.startswith("##   ")]
    text = uncomment("\n".join(lines)) + "\n" + "\n".join(shard) + "\n"
    cfg = parse_fleet_config(parse_toml(text, str(FLEET)), str(FLEET))
    (one,) = cfg.broker.shards
    assert (one.name, one.port, one.sites) == ("east", 8884, ["plant-east"])
