"""The firmware profile a new device is set up with: a name or path given, or ``auto``,
which is :func:`runtime.profiles.load_profile`'s own detection (device-tree model, then
machine, ``$EDGEFLEET_PROFILE`` first); the reason it gives in its log is kept to tell
the field engineer why."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from runtime.profiles import Profile, list_profiles, load_profile

_DETECT_LOGGER = "runtime.profiles.detect"


@dataclass(frozen=True)
class ChosenProfile:
    """The profile and why it was taken."""

    profile: Profile
    reason: str

    @property
    def name(self) -> str:
        return self.profile.name


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def choose_profile(
    name_or_path: str = "auto",
    *,
    device_tree_model_path: str = "/proc/device-tree/model",
    machine: str | None = None,
) -> ChosenProfile:
    """The profile ``name_or_path`` names, or the one auto detection picks.

    Raises:
        ProfileError: an unknown name (the known ones in the message), a bad file, or no
            profile matches this device.
    """
    if name_or_path != "auto":
        profile = load_profile(name_or_path)
        return ChosenProfile(profile, "given")
    logger = logging.getLogger(_DETECT_LOGGER)
    keep = _Keep()
    level, propagate = logger.level, logger.propagate
    logger.addHandler(keep)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        profile = load_profile(
            "auto", device_tree_model_path=device_tree_model_path, machine=machine
        )
    finally:
        logger.removeHandler(keep)
        logger.setLevel(level)
        logger.propagate = propagate
    chosen = [m for m in keep.messages if m.startswith("firmware profile ")]
    prefix = f"firmware profile {profile.name} chosen: "
    reason = chosen[-1].removeprefix(prefix) if chosen else "detected"
    return ChosenProfile(profile, f"auto: {reason}")


def known_profiles() -> list[str]:
    """The bundled profiles' names (for help texts)."""
    return list_profiles()
