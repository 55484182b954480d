"""Firmware profiles: one TOML file per device class, validated by a typed schema.

A profile says how the runtime uses one class of device: which cores its workers are
pinned to, how many workers, which execution providers and TFLite delegates to try, and
its budgets. The bundled profiles live in the ``firmware_profiles`` package; a field
engineer may point at any other file.

Example::

    profile = load_profile("auto")          # or "jetson-orin", or "/etc/edgefleet/p.toml"
    cores = profile.resolve_cores()          # e.g. [2, 3, 4, 5] on an Orin Nano
    workers = profile.resolve_workers()

``"auto"`` reads ``/proc/device-tree/model`` and ``platform.machine()``: a profile whose
``match.device_tree_model`` substring occurs in the model wins (the longest substring if
several do); otherwise the profile whose ``match.machine`` lists this machine is taken.
``EDGEFLEET_PROFILE`` (a name or a path) overrides auto detection.

The schema is in :mod:`runtime.profiles.schema`, reading files in
:mod:`runtime.profiles.files`, choosing the device's profile in
:mod:`runtime.profiles.detect`.
"""

from runtime.profiles.detect import ENV_VAR, load_profile
from runtime.profiles.files import list_profiles
from runtime.profiles.schema import MatchRule, ProcessesConfig, Profile, VideoConfig

__all__ = [
    "ENV_VAR",
    "MatchRule",
    "ProcessesConfig",
    "Profile",
    "VideoConfig",
    "list_profiles",
    "load_profile",
]
