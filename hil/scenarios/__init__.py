"""The scenarios, in the order of the issues; ``hil list`` shows them."""

from __future__ import annotations

from hil.scenario import Scenario
from hil.scenarios.delivery import DownloadCut, RolloutCut
from hil.scenarios.line import PlcLinkCut
from hil.scenarios.resilience import BrokerRestartUnderLoad, DiskFullScenario
from hil.scenarios.uplink import Lossy, Offline

SCENARIOS: dict[str, type[Scenario]] = {
    s.name: s
    for s in (
        Offline,
        DownloadCut,
        RolloutCut,
        BrokerRestartUnderLoad,
        DiskFullScenario,
        Lossy,
        PlcLinkCut,
    )
}
"""Scenario classes by name."""
