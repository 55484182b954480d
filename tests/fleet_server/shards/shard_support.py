"""Helpers of the broker shard tests: a device enrolled over the API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.wire.enroll import ENROLL_PATH
from fleet_server.ca import make_device_key_and_csr
from tests.fleet_server.fleet_api_support import OPERATOR_TOKEN, http


def enroll(url: str, device_id: str, labels: dict[str, str], directory: Path) -> dict[str, Any]:
    token = http(
        "POST", f"{url}/api/v1/devices/{device_id}/tokens", {"labels": labels}, token=OPERATOR_TOKEN
    )
    assert token.status == 201, token.body
    key_pem, csr_pem = make_device_key_and_csr(device_id)
    answer = http(
        "POST", url + ENROLL_PATH, {"token": token.body["token"], "csr": csr_pem.decode()}
    )
    assert answer.status == 200, answer.body
    body: dict[str, Any] = answer.body
    (directory / "ca.crt").write_text(body["ca"])
    (directory / f"{device_id}.crt").write_text(body["certificate"])
    (directory / f"{device_id}.key").write_bytes(key_pem)
    return body
