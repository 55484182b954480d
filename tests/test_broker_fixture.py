"""The broker fixture is a real Mosquitto: a message goes through it and back."""

from __future__ import annotations

import subprocess

from tests.support.broker import Broker


def test_mosquitto_fixture_carries_a_message(mosquitto: Broker) -> None:
    sub = subprocess.Popen(
        [
            "mosquitto_sub",
            "-h",
            mosquitto.host,
            "-p",
            str(mosquitto.port),
            "-t",
            "t/x",
            "-C",
            "1",
            "-W",
            "10",
        ],
        stdout=subprocess.PIPE,
    )
    for _ in range(50):
        subprocess.run(
            [
                "mosquitto_pub",
                "-h",
                mosquitto.host,
                "-p",
                str(mosquitto.port),
                "-t",
                "t/x",
                "-m",
                "hello",
            ],
            check=True,
        )
        try:
            out, _ = sub.communicate(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            continue
    else:
        sub.kill()
        out = b""
    assert out.strip() == b"hello"
