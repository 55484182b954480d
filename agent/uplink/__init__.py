"""The device's uplink to the fleet: reported state, heartbeats, health, events and
decision uploads over MQTT 5 with TLS client certificates (:mod:`agent.enrollment.identity`)."""

from agent.uplink.config import UplinkConfig
from agent.uplink.service import Uplink, UplinkError
from agent.uplink.sysinfo import SysInfo

__all__ = ["SysInfo", "Uplink", "UplinkConfig", "UplinkError"]
