"""Property-based fuzzing of what the device reads from files: bundle manifests (the
agent's parser and ``fleetctl bundle build``), directives and trusted roots (signed by
real keys, mutated, and re-signed so the checks behind the signature are reached too),
and the agent's TOML configuration.

Property: a valid result or the parser's documented error (with a message); never
another exception, never a ``RecursionError``.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from tuf.api.metadata import (  # type: ignore[attr-defined, unused-ignore]
    Metadata,
    Root,
    TargetFile,
    Targets,
)

from agent.config import AgentConfig, load_config
from agent.kernel.errors import BundleError, ConfigError
from agent.update.directive import Directive, verify_directive
from agent.update.errors import DirectiveRefused, TrustRootError
from agent.update.trust import check_root
from agent.wire.manifest import BundleManifest, parse_manifest
from agent.wire.topics import is_device_id
from fleet_server.repository.bundledir import build_bundle
from tests.agent.update.tuf_repo import DIRECTOR, TufRepo
from tests.security.fuzz_support import (
    HOSTILE_SCALARS,
    MAX_MESSAGE,
    TEXT,
    holds,
    hostile_payloads,
)

SHA = "0" * 64
MANIFEST: dict[str, Any] = {
    "schema_version": 1,
    "name": "text-cls",
    "version": "1.2.3",
    "release": 4,
    "models": {"onnx": {"file": "models/cls.onnx", "sha256": SHA, "size": 10}},
    "input": {"name": "x", "shape": [1, 3, 48, 192], "dtype": "float32"},
    "outputs": [{"name": "probs", "shape": [1, 2], "dtype": "float32"}],
    "preprocess": {
        "width": 192,
        "height": 48,
        "color": "bgr",
        "layout": "nchw",
        "scale": 0.00392156862745098,
        "mean": [0.5, 0.5, 0.5],
        "std": [0.5, 0.5, 0.5],
        "dtype": "float32",
        "interpolation": "linear",
    },
    "postprocess": {"kind": "classification", "output": "probs", "top_k": 2, "labels": ["a", "b"]},
    "policy": {"rules": [{"outcome": "review", "label": "b"}], "default": "pass"},
    "profiles": ["x86-gateway"],
    "latency_budget_ms": 20.0,
}


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fuzz-files-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- manifests ---------------------------------------------------------------------------


@settings(max_examples=500)
@given(hostile_payloads(MANIFEST))
def test_manifests_parse_or_are_one_bundle_error(data: bytes) -> None:
    manifest = holds(lambda: parse_manifest(data, "bundle/manifest.json"), BundleError)
    assert manifest is None or isinstance(manifest, BundleManifest)


@settings(max_examples=150)
@given(data=hostile_payloads(MANIFEST))
def test_fleetctl_bundle_build_builds_or_is_one_bundle_error(workdir: Path, data: bytes) -> None:
    bundle = workdir / "bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    (bundle / "models").mkdir(parents=True)
    (bundle / "models" / "cls.onnx").write_bytes(b"0123456789")
    (bundle / "manifest.json").write_bytes(data)
    built = holds(lambda: build_bundle(bundle), BundleError)
    if built is not None:
        assert built.models["onnx"].size == 10


# -- directives and roots, signed by real keys -------------------------------------------


@pytest.fixture(scope="module")
def repo(workdir: Path) -> TufRepo:
    return TufRepo(workdir / "repo")


def _resigned(data: bytes, signers: list[Any], doc: type[Targets] | type[Root]) -> bytes:
    """``data`` signed again by ``signers`` when it is still metadata python-tuf can
    build; else as it is (the fuzzer then tests the signature check itself)."""
    try:
        md = Metadata[doc].from_bytes(data)  # type: ignore[valid-type]
        md.signatures.clear()
        for signer in signers:
            md.sign(signer, append=True)
        return md.to_bytes()
    except Exception:
        return data


def _directive(repo: TufRepo) -> dict[str, Any]:
    path = "bundles/text-cls/4/manifest.json"
    target = TargetFile(1234, {"sha256": "ab" * 32}, path)
    data = repo.directive(path, counter=3, device_id="cam-01", target=target)
    value: dict[str, Any] = json.loads(data)
    return value


@settings(max_examples=250)
@given(data=st.data())
def test_directives_verify_or_are_refused(repo: TufRepo, data: st.DataObject) -> None:
    payload = data.draw(hostile_payloads(_directive(repo), max_depth=60_000))
    if data.draw(st.booleans()):
        payload = _resigned(payload, repo.signers[DIRECTOR], Targets)
    directive = holds(
        lambda: verify_directive(
            payload, repo.targets.signed, device_id="cam-01", hardware_class="x86-gateway"
        ),
        DirectiveRefused,
    )
    if directive is not None:
        assert isinstance(directive, Directive)
        assert directive.device_id == "cam-01"


@settings(max_examples=150)
@given(data=st.data())
def test_roots_check_or_are_refused(repo: TufRepo, data: st.DataObject) -> None:
    payload = data.draw(hostile_payloads(repo.root.to_dict(), max_depth=100_000))
    if data.draw(st.booleans()):
        payload = _resigned(payload, repo.signers["root"], Root)
    root = holds(lambda: check_root(payload, "root.json"), TrustRootError)
    assert root is None or isinstance(root.signed, Root)


# -- the agent's configuration -----------------------------------------------------------

CONFIG: dict[str, Any] = {
    "agent": {"device_id": "dev-1", "state_dir": "state", "disk_budget_mb": 4096},
    "runtime": {"workers": 2, "heartbeat_timeout_s": 5.0},
    "mqtt": {"port": 1883, "keepalive_s": 30},
    "http": {"port": 9464},
    "decision_log": {"budget_mb": 512, "flush_interval_s": 0.5, "max_age_days": 30},
    "uplink": {"outbox_max_mb": 64, "heartbeat_interval_s": 1.0, "broker_port": 8883},
    "bundles": {"fetch_timeout_s": 10.0, "installer": {"health_window_s": 60.0}},
    "actions": {"queue_bound": 1000},
    "cameras": [{"name": "cam1", "kind": "synthetic", "fps": 10.0}],
    "sensors": [{"name": "s1", "kind": "mqtt", "topic": "line/t", "fields": ["t"]}],
}
KEYS = sorted({k for section in CONFIG.values() if isinstance(section, dict) for k in section})
TOML_SCALARS = [v for v in HOSTILE_SCALARS if v is not None] + [100_000, 70_000, 1e30, -5.0]


def _toml_value(value: Any) -> str:  # noqa: PLR0911 - one return per TOML type
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else ("inf" if value > 0 else "-inf")
            if math.isinf(value)
            else repr(value)
        )
    if isinstance(value, str):
        return json.dumps(value)  # escapes as TOML reads them (lone surrogates: refused)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        items = (f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None)
        return "{" + ", ".join(items) + "}"
    return '""'


def _toml(config: dict[str, Any]) -> str:
    lines = []
    for name, section in config.items():
        if isinstance(section, list):
            for item in section:
                lines.append(f"[[{name}]]")
                lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in item.items()]
        elif isinstance(section, dict):
            lines.append(f"[{name}]")
            lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in section.items()]
        else:
            lines.insert(0, f"{json.dumps(name)} = {_toml_value(section)}")
    return "\n".join(lines) + "\n"


@st.composite
def configs(draw: st.DrawFn) -> str:
    """The valid CONFIG with 0-4 keys set to hostile values or to numbers near the
    field's own (often still valid), and a quarter of the texts damaged after."""
    config = json.loads(json.dumps(CONFIG))
    for _ in range(draw(st.integers(0, 4))):
        section = draw(st.sampled_from(sorted(config)))
        target = config[section]
        if isinstance(target, list):
            target = target[0]
        key = draw(st.one_of(st.sampled_from(KEYS), st.sampled_from(sorted(target)), TEXT))
        old = target.get(key)
        near: st.SearchStrategy[Any] = st.nothing()
        if type(old) is int and 0 <= old < 2**40:
            near = st.integers(0, 2 * old + 2)
        elif type(old) is float and 0 <= old < 1e12:
            near = st.floats(0, 2 * old + 1)
        target[key] = draw(st.one_of(near, near, st.sampled_from(TOML_SCALARS), TEXT, st.floats()))
    text = _toml(config)
    if draw(st.integers(0, 3)) == 0:
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.text(max_size=20)) + text[at:]
    return text


@settings(max_examples=400)
@given(
    st.one_of(
        configs(),
        configs(),
        st.binary(max_size=300).map(lambda b: b.decode("latin-1")),
        st.sampled_from(["a = " + "[" * 5000 + "]" * 5000, "x = " + "9" * 5000]),
    )
)
def test_agent_configs_load_or_are_one_config_error_naming_the_file(
    workdir: Path, text: str
) -> None:
    path = workdir / "agent.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    refused: ConfigError | None = None
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        refused = exc
    event("refused" if refused else "valid")
    if refused is not None:
        assert refused.path == str(path)
        assert refused.reason.strip()
        return
    assert isinstance(cfg, AgentConfig)
    assert is_device_id(cfg.agent.device_id)
    assert not cfg.agent.state_dir.exists() or cfg.agent.state_dir.is_dir()
    for number in _numbers(cfg.model_dump()):
        assert math.isfinite(number)


def _numbers(value: Any) -> Iterator[float]:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield float(value)
    elif isinstance(value, dict):
        for sub in value.values():
            yield from _numbers(sub)
    elif isinstance(value, list | tuple):
        for sub in value:
            yield from _numbers(sub)


def test_a_directive_for_a_huge_device_name_is_refused_in_a_short_message(repo: TufRepo) -> None:
    path = "bundles/text-cls/4/manifest.json"
    target = TargetFile(1234, {"sha256": "ab" * 32}, path)
    data = repo.directive(path, counter=3, device_id="d" * 60_000, target=target)
    with pytest.raises(DirectiveRefused, match="60000 characters") as info:
        verify_directive(
            data, repo.targets.signed, device_id="cam-01", hardware_class="x86-gateway"
        )
    assert len(str(info.value)) <= MAX_MESSAGE


def test_a_directive_holding_a_float_is_refused_not_a_serialization_crash(repo: TufRepo) -> None:
    """Found by the fuzzer: canonical JSON has no floats, and python-tuf's SerializationError
    escaped verify_directive."""
    doc = _directive(repo)
    doc["signed"]["custom"] = 0.0
    with pytest.raises(DirectiveRefused, match="not canonical JSON") as info:
        verify_directive(
            json.dumps(doc).encode(),
            repo.targets.signed,
            device_id="cam-01",
            hardware_class="x86-gateway",
        )
    assert len(str(info.value)) <= MAX_MESSAGE
