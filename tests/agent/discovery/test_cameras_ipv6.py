"""``edge-agent cameras`` finds an ONVIF camera that answers over IPv6 only (ff02::c, hop
limit 1) on a real veth link, and reads its profiles at its link-local address with the
zone of the interface the reply came in on."""

from __future__ import annotations

import json

from tests.agent.discovery.onvif_camera import ENDPOINT, PASSWORD, USER, agent, onvif_camera


def test_a_camera_answering_over_ipv6_only_is_listed_with_zoned_link_local_addresses() -> None:
    with onvif_camera(families="6") as cam:
        run = agent(
            cam.gw, "cameras", "--json", "--timeout", "1", "--user", USER,
            env={"CAM_PASSWORD": PASSWORD},
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        report = json.loads(run.stdout)
        hop_limits = list(cam.hop_limits)
        assert not cam.ttls  # the IPv4 probe went out, nothing answers it
    stats = report["probe"]
    assert stats["families"] == ["ipv4", "ipv6"]  # both by default
    assert stats["links6"] == ["ea"]  # lo is not probed
    assert stats["hop_limit"] == 1
    assert hop_limits
    assert set(hop_limits) == {1}
    [found] = report["onvif"]
    assert found["endpoint"] == ENDPOINT
    assert found["sender"].startswith("[fe80::")
    assert found["sender"].endswith("%ea]:3702")
    [xaddr] = found["xaddrs"]
    assert xaddr.startswith(f"http://[{cam.cam6}%25ea]:")
    assert found["error"] == ""
    assert found["media_xaddr"].startswith(f"http://[{cam.cam6}%25ea]:")
    uris = {p["name"]: p["uri"] for p in found["profiles"]}
    assert uris["MainStream"] == f"rtsp://[{cam.cam6}%25ea]:554/main_tok"


def test_ip_4_sends_no_ipv6_probe() -> None:
    with onvif_camera(families="46") as cam:
        run = agent(cam.gw, "cameras", "--json", "--timeout", "0.6", "--ip", "4")
        assert run.returncode == 0, run.stderr
        assert not cam.hop_limits
        assert cam.ttls
        assert set(cam.ttls) == {1}
    report = json.loads(run.stdout)
    assert report["probe"]["families"] == ["ipv4"]
    [found] = report["onvif"]
    assert found["sender"].startswith("192.0.2.2:")
    assert found["error"] == "unauthorized"  # no --user: listed, profiles not read
