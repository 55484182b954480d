"""Which firmware profile this device runs: a name or path given, ``$EDGEFLEET_PROFILE``,
or auto detection from the device-tree model and the machine.

Auto detection: a profile whose ``match.device_tree_model`` substring occurs in
``/proc/device-tree/model`` wins (the longest substring if several do); otherwise the
profile whose ``match.machine`` lists this machine; otherwise the default profile for the
machine.
"""

from __future__ import annotations

import logging
import os
import platform
from pathlib import Path

from runtime.errors import ProfileError
from runtime.profiles.files import (
    ProfileDir,
    known,
    load_name_or_path,
    load_named,
    names_in,
    resolve_dir,
)
from runtime.profiles.schema import Profile, normalize_machine

log = logging.getLogger(__name__)

ENV_VAR = "EDGEFLEET_PROFILE"
"""Environment variable naming the profile (a name or a path); it overrides ``"auto"``."""

# Used only when no profile's [match] table matches this device at all.
_FALLBACK_BY_MACHINE = {"x86_64": "x86-gateway", "aarch64": "arm64-gateway"}


def load_profile(
    name_or_path: str = "auto",
    *,
    profiles_dir: str | os.PathLike[str] | None = None,
    device_tree_model_path: str = "/proc/device-tree/model",
    machine: str | None = None,
) -> Profile:
    """Load and validate a profile.

    Args:
        name_or_path: ``"auto"`` (detect this device; ``$EDGEFLEET_PROFILE`` overrides),
            a profile name looked up as ``<name>.toml`` in ``profiles_dir``, or a path
            (containing "/" or ending in ".toml").
        profiles_dir: where names are looked up; by default the bundled
            ``firmware_profiles`` package.
        device_tree_model_path: the device-tree model file read by auto detection; a
            missing file (x86) is ignored.
        machine: the machine auto detection assumes; by default ``platform.machine()``.

    Raises:
        ProfileError: the file is missing, unreadable, not valid TOML, has an unknown
            key or a bad value, the name is unknown, or auto detection finds no profile.
    """
    directory = resolve_dir(profiles_dir)
    if name_or_path == "auto":
        override = os.environ.get(ENV_VAR, "").strip()
        if override and override != "auto":
            log.info("firmware profile %s chosen by $%s", override, ENV_VAR)
            return load_name_or_path(override, directory)
        return _detect(directory, device_tree_model_path, machine)
    return load_name_or_path(name_or_path, directory)


def _read_device_tree_model(path: str) -> str:
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        log.debug("no device-tree model at %s (not a device-tree platform)", path)
        return ""
    except OSError as exc:
        log.warning("cannot read device-tree model %s: %s; ignoring it", path, exc)
        return ""
    # The kernel exposes the property with its trailing NUL.
    return raw.decode("utf-8", errors="replace").strip("\x00").strip()


def _detect(directory: ProfileDir, device_tree_model_path: str, machine: str | None) -> Profile:
    model = _read_device_tree_model(device_tree_model_path)
    arch = normalize_machine(machine if machine is not None else platform.machine())
    if not directory.is_dir():
        raise ProfileError(str(directory), None, "profiles directory does not exist")
    profiles = [load_named(name, directory) for name in names_in(directory)]

    folded = model.casefold()
    by_tree: list[tuple[int, str, Profile]] = []
    for profile in profiles:
        hits = [s for s in profile.match.device_tree_model if folded and s.casefold() in folded]
        if hits:
            best = max(hits, key=len)
            by_tree.append((len(best), best, profile))
    if by_tree:
        by_tree.sort(key=lambda hit: (-hit[0], hit[2].name))
        _, substring, chosen = by_tree[0]
        if len(by_tree) > 1 and by_tree[1][0] == by_tree[0][0]:
            log.warning(
                "device-tree model %r matches profiles %s equally; taking %s",
                model,
                ", ".join(hit[2].name for hit in by_tree if hit[0] == by_tree[0][0]),
                chosen.name,
            )
        log.info(
            "firmware profile %s chosen: device-tree model %r contains %r",
            chosen.name,
            model,
            substring,
        )
        return chosen

    by_machine = [profile for profile in profiles if arch in profile.match.machine]
    if by_machine:
        chosen = by_machine[0]
        if len(by_machine) > 1:
            log.warning(
                "machine %s matches profiles %s; taking %s",
                arch,
                ", ".join(profile.name for profile in by_machine),
                chosen.name,
            )
        log.info(
            "firmware profile %s chosen: machine %s (device-tree model %r matched no profile)",
            chosen.name,
            arch,
            model or "absent",
        )
        return chosen

    fallback = _FALLBACK_BY_MACHINE.get(arch)
    for profile in profiles:
        if profile.name == fallback:
            log.info(
                "firmware profile %s chosen: default for machine %s (no profile's [match] "
                "fits device-tree model %r)",
                profile.name,
                arch,
                model or "absent",
            )
            return profile
    raise ProfileError(
        str(directory),
        None,
        f"no profile matches this device (device-tree model {model or 'absent'!r}, "
        f"machine {arch!r}); known: {known(directory)}; name one or set ${ENV_VAR}",
    )
