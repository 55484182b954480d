"""Helpers for the fleet server API tests: a signed repository with one published bundle,
a rollout service built on the real pure controller and the real rollout store
(:class:`LocalRolloutOps`), a fleet server running in this process, and JSON over HTTP."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent.kernel.bundle import init_bundle
from fleet_server.api import ActionRefused, ServerContext
from fleet_server.config import FleetServerConfig, parse_config
from fleet_server.db import RolloutConflict, store
from fleet_server.db.store import RolloutRecord
from fleet_server.repository import KeyStore, Passphrases, Repository
from fleet_server.rollout import (
    Approve,
    BundleRef,
    Cancel,
    DeviceInfo,
    Pause,
    Resolve,
    Resume,
    Rollback,
    RolloutError,
    Tick,
    from_dict,
    parse_spec,
    plan,
    refusal,
    step,
    to_dict,
)
from fleet_server.rollout.view import view
from fleet_server.serve import FleetServer

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_TFLITE = REPO_ROOT / "tests" / "data" / "tiny_classifier.tflite"
PASSPHRASE = "fleet api test passphrase"  # noqa: S105 (generated keys, test only)
OPERATOR_TOKEN = "operator-token-for-tests-0123456789"  # noqa: S105 (test only)
WRONG_TOKEN = "not-the-operator-token"  # noqa: S105 (test only)
TOKEN_ENV = "EDGEFLEET_TEST_OPERATOR_TOKEN"  # noqa: S105 (a variable name)
HTTP_TIMEOUT_S = 30.0


def make_repository(directory: Path) -> tuple[Path, Path]:
    """A keystore and an initialised repository with bundle ``tiny`` 1.0.0 (release 1)
    published; returns (repository, keystore)."""
    pp = Passphrases(environ={"EDGEFLEET_KEY_PASSPHRASE": PASSPHRASE})
    keys = KeyStore.create(directory / "keystore", root_keys=1, root_threshold=1, passphrases=pp)
    repo = Repository(directory / "repository")
    repo.init(keys)
    init_bundle(TINY_TFLITE, directory / "bundle", name="tiny", version="1.0.0")
    repo.publish(directory / "bundle", keys)
    return repo.path, keys.path


def api_config(
    state_dir: Path,
    repo: Path,
    keystore: Path,
    *,
    db_url: str | None = None,
    token: bool = True,
    broker: Mapping[str, Any] | None = None,
) -> FleetServerConfig:
    """A config on a free API port; an external broker (nothing started) unless given."""
    data: dict[str, Any] = {
        "server": {"state_dir": str(state_dir)},
        "http": {"port": 0, **({"operator_token_env": TOKEN_ENV} if token else {})},
        "repository": {"path": str(repo), "keystore": str(keystore)},
        "broker": dict(broker)
        if broker is not None
        else {
            "managed": False,
            "advertise_host": "fleet.test",
            "external": {
                "host": "127.0.0.1",
                "port": 8883,
                "ca": str(state_dir / "ca" / "ca.crt"),
                "cert": str(state_dir / "fleet-server.crt"),
                "key": str(state_dir / "fleet-server.key"),
            },
        },
    }
    if db_url is not None:
        data["database"] = {"url": db_url}
    return parse_config(data)


class LocalRolloutOps:
    """RolloutOps on the pure controller (plan/step) and the rollout table; one Tick after
    each change, no directives sent (the API tests need states, not devices)."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    def start(self) -> None:
        self.ctx.rollouts = self

    def stop(self) -> None:
        self.ctx.rollouts = None

    def create(self, spec_mapping: Mapping[str, Any], *, rollout_id: str | None = None) -> str:
        spec = parse_spec(spec_mapping)
        releases = [
            b.release for b in self.ctx.repository.bundles(spec.bundle) if b.version == spec.version
        ]
        if not releases:
            raise RolloutError("bundle", f"{spec.bundle}@{spec.version} is not published")
        devices = [
            DeviceInfo(
                d.device_id,
                {**d.labels, "profile": d.profile},
                online=d.online,
                active=BundleRef(d.active_bundle, d.active_release)
                if d.active_bundle is not None and d.active_release is not None
                else None,
            )
            for d in store.list_devices(self.ctx.engine, include_revoked=False)
        ]
        now = time.time()
        rid = rollout_id or f"r-{uuid.uuid4().hex[:12]}"
        if store.load_rollout(self.ctx.engine, rid) is not None:
            raise RolloutConflict(rid, 0, "a rollout with this id exists")
        rollout = plan(rid, spec, releases[-1], devices, now)
        rollout, _ = step(rollout, Tick(now))
        record = RolloutRecord(
            rollout_id=rollout.rollout_id,
            bundle=spec.bundle,
            release=releases[-1],
            version=spec.version,
            selector=dict(spec.selector),
            waves=list(spec.waves),
            soak_s=float(spec.soak_s),
            policy=spec.policy.model_dump(mode="json"),
            state=rollout.phase.value,
            controller_state=to_dict(rollout),
        )
        store.save_rollout(self.ctx.engine, record)
        return rollout.rollout_id

    def _record(self, rollout_id: str) -> RolloutRecord:
        record = store.load_rollout(self.ctx.engine, rollout_id)
        assert record is not None, rollout_id
        return record

    def get(self, rollout_id: str) -> dict[str, Any]:
        record = self._record(rollout_id)
        return view(record, from_dict(record.controller_state), full=True)

    def list(self) -> list[dict[str, Any]]:
        return [
            view(r, from_dict(r.controller_state), full=False)
            for r in store.list_rollouts(self.ctx.engine)
        ]

    def resolve(
        self,
        rollout_id: str,
        device_id: str,
        how: str,
        *,
        release: int | None = None,
        reason: str = "",
        by: str = "",
    ) -> dict[str, Any]:
        record = self._record(rollout_id)
        rollout = from_dict(record.controller_state)
        event = Resolve(time.time(), device_id, how, release, by, reason)
        why = refusal(rollout, event)
        if why is not None:
            raise ActionRefused(rollout_id, "resolve", why)
        rollout, _ = step(rollout, event)
        updated = replace(record, state=rollout.phase.value, controller_state=to_dict(rollout))
        store.save_rollout(self.ctx.engine, updated)
        return self.get(rollout_id)

    def act(self, rollout_id: str, action: str, reason: str, *, by: str = "") -> dict[str, Any]:
        record = self._record(rollout_id)
        rollout = from_dict(record.controller_state)
        now = time.time()
        event = {
            "pause": Pause(now, reason),
            "resume": Resume(now),
            "approve": Approve(now),
            "cancel": Cancel(now, reason),
            "rollback": Rollback(now, reason),
        }[action]
        why = refusal(rollout, event)
        if why is not None:
            raise ActionRefused(rollout_id, action, why)
        rollout, _ = step(rollout, event)
        updated = replace(record, state=rollout.phase.value, controller_state=to_dict(rollout))
        store.save_rollout(self.ctx.engine, updated)
        return self.get(rollout_id)


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str]


def http(
    method: str,
    url: str,
    body: Any = None,
    *,
    token: str | None = None,
    raw: bytes | None = None,
) -> Answer:
    """One request; an error status is an answer, not an exception."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:  # noqa: S310
            return Answer(resp.status, json.loads(resp.read()), dict(resp.headers))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, json.loads(exc.read() or b"null"), dict(exc.headers))


@dataclass
class RunningApi:
    """A fleet server in this process and its operator token."""

    server: FleetServer
    token: str = OPERATOR_TOKEN

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def ctx(self) -> ServerContext:
        return self.server.context

    def call(self, method: str, path: str, body: Any = None) -> Answer:
        return http(method, self.url + path, body, token=self.token)
