"""``edge-agent setup`` as a library: a fresh install made a configured device.

Order, so that bad input changes nothing (every check before the first write):

1. an existing config is refused without ``force``; with it, the file is read and what
   setup is not asked to change is kept (:mod:`agent.setup.previous`), or setup refuses,
   naming what would be lost;
2. the profile, the device id, each camera (a V4L2 node is asked with real ioctls), the
   bundle (its manifest loads and lists the profile) and the owner are resolved, the
   config is rendered and parsed by the agent's own parser;
3. with a fleet: enrollment (the one step that talks to the network; it writes only once
   the fleet's answer checks out, and a state directory it had to create is removed
   again when it fails);
4. the bundle copied into the state directory, the config written (durable, 0640), the
   systemd drop-in written (and systemd reloaded when it runs), the credentials
   directory made (0700), what setup made in the state directory given to the owner;
5. ``check-config``'s checks on the file as written.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent.config import load_config
from agent.kernel.bundle import load_bundle
from agent.kernel.durable import copy_durable, fsync_dir, hash_file, make_dirs
from agent.kernel.errors import EdgefleetError
from agent.planning import plan_pipelines
from agent.setup import dropin
from agent.setup.cameras import (
    DEV_DIR,
    Camera,
    CameraProbeError,
    choose_size,
    list_cameras,
    probe,
)
from agent.setup.enrolling import enroll_device, enrollment, kept_enrollment
from agent.setup.errors import SetupError
from agent.setup.options import SetupOptions, SetupReport
from agent.setup.previous import Previous, lost_pipelines, read_previous
from agent.setup.profile import ChosenProfile, choose_profile
from agent.setup.writer import BundleEntry, CameraEntry, DevicePlan, check, render, write_config
from agent.wire.topics import is_device_id
from runtime.errors import EdgeRuntimeError

SERVICE_USER = "edgefleet"
SYNTHETIC = ("test", "synthetic")
LOCAL_BUNDLES = "local-bundles"
MAX_BUNDLE_FILES = 1000


@dataclass(frozen=True)
class Owner:
    """Who the service runs as: state is theirs, the config is readable by their group."""

    name: str
    uid: int
    gid: int


def resolve_owner(name: str | None) -> Owner:
    """``name``'s ids; by default the ``edgefleet`` user when it exists, else whoever runs
    setup.

    Raises:
        SetupError: ``name`` is not a user.
    """
    if name is None:
        try:
            pw = pwd.getpwnam(SERVICE_USER)
        except KeyError:
            pw = pwd.getpwuid(os.getuid())
    else:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise SetupError(f"--owner {name}", "no such user") from None
    return Owner(pw.pw_name, pw.pw_uid, pw.pw_gid)


def _profile(name: str) -> ChosenProfile:
    try:
        return choose_profile(name)
    except EdgeRuntimeError as exc:
        raise SetupError(f"--profile {name}", " ".join(str(exc).split())) from None


def _device_id(given: str | None) -> str:
    value = given or socket.gethostname()
    if not is_device_id(value):
        what = "--device-id" if given else f"host name {value!r}"
        raise SetupError(what, "not a device id (1-64 of A-Z a-z 0-9 _ . -; give --device-id)")
    return value


GENICAM_PREFIX = "genicam:"
_URL_KINDS = (
    (("rtsp://", "rtsps://"), "rtsp", ""),
    (("http://", "https://"), "http", "an MJPEG stream"),
)


def camera_entry(
    value: str, name: str, dev_dir: Path = DEV_DIR
) -> tuple[CameraEntry, Camera | None]:
    """The config entry for ``--camera value`` (and what a V4L2 device answered).

    Raises:
        SetupError: no such device or file, or a device that captures no video.
    """
    what = f"--camera {value}"
    lowered = value.lower()
    if lowered in SYNTHETIC:
        return CameraEntry(name, "synthetic", note="a generated test pattern"), None
    for prefixes, kind, note in _URL_KINDS:
        if lowered.startswith(prefixes):
            return CameraEntry(name, kind, value, note=note), None
    if lowered.startswith(GENICAM_PREFIX):
        return genicam_entry(value[len(GENICAM_PREFIX) :].strip(), name, what), None
    if "://" in value:
        raise SetupError(what, "unknown URL scheme (rtsp://, rtsps://, http:// or https://)")
    path = dev_dir / f"video{value}" if value.isdigit() else Path(value)
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise SetupError(what, f"no such device or file ({exc.strerror})") from None
    if stat.S_ISCHR(mode):
        try:
            cam = probe(path)
        except CameraProbeError as exc:
            raise SetupError(what, str(exc.strerror or exc)) from None
        if not cam.capture:
            raise SetupError(what, f"{cam.card or cam.driver}: not a video capture node")
        size = choose_size(cam)
        note = f"{cam.card} ({cam.driver}); {size.width}x{size.height}: {size.reason}"
        return CameraEntry(name, "v4l2", str(path), size.width, size.height, note), cam
    absolute = path.resolve()
    if stat.S_ISDIR(mode):
        return CameraEntry(name, "images", str(absolute), note="a directory of images"), None
    if stat.S_ISREG(mode):
        return CameraEntry(name, "file", str(absolute), note="a video file, looped"), None
    raise SetupError(what, "not a device, a file, a directory or a URL")


def genicam_entry(ref: str, name: str, what: str) -> CameraEntry:
    """The entry of the GenICam camera ``ref`` (serial number, Aravis id or address) as
    discovery finds it now.

    Raises:
        SetupError: libaravis is missing, or no camera answers to ``ref``.
    """
    from agent.capture.genicam import aravis  # noqa: PLC0415 - only for a genicam camera

    try:
        found = aravis.devices()
    except aravis.AravisUnavailable as e:
        raise SetupError(what, e.message) from None
    for d in found:
        if ref and ref in (d.serial, d.id, d.address):
            note = f"{d.vendor} {d.model} serial {d.serial} ({d.protocol} {d.address})"
            return CameraEntry(name, "genicam", d.serial or d.id, note=note)
    listed = ", ".join(d.serial or d.id for d in found) or "none"
    raise SetupError(what, f"no GenICam camera {ref!r} found (found: {listed})")


def _cameras(
    opts: SetupOptions, report: SetupReport, previous: Previous | None = None
) -> tuple[list[CameraEntry], list[dict[str, Any]] | None]:
    """The cameras given (replacing the previous config's), else the previous config's
    as they were, else every V4L2 capture device found."""
    entries: list[CameraEntry] = []
    old = previous.tables("cameras") if previous is not None else []
    if opts.cameras:
        names = [f"cam{i}" for i in range(len(opts.cameras))]
        discovered = _onvif(opts, names)
        for name, value in zip(names, opts.cameras, strict=True):
            entry = discovered.get(name) or camera_entry(value, name, opts.dev_dir)[0]
            if entry.kind in ("rtsp", "http") and opts.camera_user and not entry.username:
                entry = replace(
                    entry, username=opts.camera_user, password_env=opts.camera_password_env
                )
            entries.append(entry)
        if old:
            was = ", ".join(str(c.get("name", "?")) for c in old)
            report.done.append(f"replaced the previous cameras ({was}) with --camera's")
        return entries, None
    if old:
        for c in old:
            entry = CameraEntry(
                str(c.get("name", "")), str(c.get("kind", "")), str(c.get("uri", ""))
            )
            entries.append(entry)
        return entries, old
    found = list_cameras(opts.sysfs_root, opts.dev_dir)
    report.found = [c.to_dict() for c in found]
    for cam in found:
        if cam.capture and not cam.error:
            entry, _ = camera_entry(cam.device, f"cam{len(entries)}", opts.dev_dir)
            entries.append(entry)
    return entries, None


def _onvif(opts: SetupOptions, names: list[str]) -> dict[str, CameraEntry]:
    """The entries of the ``onvif:`` cameras given (one probe for all), keyed by name."""
    refs = [(n, v) for n, v in zip(names, opts.cameras, strict=True) if v.startswith("onvif:")]
    if not refs:
        return {}
    from agent.setup import onvif  # noqa: PLC0415 - discovery only when asked for

    d = onvif.Discovery(
        opts.discover_timeout_s,
        opts.discover_interface,
        opts.discover_ip,
        opts.camera_user,
        opts.camera_password_env,
        opts.credentials_dir,
    )
    return onvif.entries(refs, d)


def _bundle(opts: SetupOptions, profile: str) -> BundleEntry | None:
    if opts.bundle is None:
        return None
    what = f"--bundle {opts.bundle}"
    try:
        bundle = load_bundle(opts.bundle)
        bundle.check_profile(profile)
    except EdgefleetError as exc:
        raise SetupError(what, " ".join(str(exc).split())) from None
    m = bundle.manifest
    dest = opts.state_dir / LOCAL_BUNDLES / f"{m.name}-{m.version}"
    return BundleEntry(m.name, str(m.version), dest)


def copy_bundle(src: Path, dest: Path) -> bool:
    """Copy the bundle directory ``src`` to ``dest`` (files durable, 0644; directories
    0755); False when ``dest`` already holds the same files.

    Raises:
        SetupError: ``src`` holds something else than files and directories, or too many.
        OSError: a copy failed.
    """
    files = _bundle_files(src)
    if dest.is_dir() and _bundle_files(dest) == files:
        same = all(hash_file(src / f) == hash_file(dest / f) for f in files)
        if same:
            return False
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    make_dirs(tmp, mode=0o755)
    for rel in files:
        target = tmp / rel
        make_dirs(target.parent, mode=0o755)
        copy_durable(src / rel, target, mode=0o644)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    fsync_dir(dest.parent)
    return True


def _bundle_files(root: Path) -> list[str]:
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                raise SetupError(f"--bundle {root}", f"{path} is not a regular file")
            out.append(str(path.relative_to(root)))
            if len(out) > MAX_BUNDLE_FILES:
                raise SetupError(f"--bundle {root}", f"over {MAX_BUNDLE_FILES} files")
    return out


def _chown_tree(path: Path, owner: Owner) -> None:
    if not path.exists() or os.geteuid() != 0:
        return
    os.chown(path, owner.uid, owner.gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(Path(dirpath) / name, owner.uid, owner.gid, follow_symlinks=False)


def _with_previous(opts: SetupOptions, previous: Previous | None) -> SetupOptions:
    """``opts`` with what the user did not give taken from the previous config."""
    if previous is None:
        return opts
    changes: dict[str, Any] = {}
    state_dir = previous.get("agent", "state_dir")
    if "state_dir" not in opts.given and isinstance(state_dir, str) and state_dir:
        path = Path(state_dir)
        changes["state_dir"] = path if path.is_absolute() else (opts.config.parent / path)
    profile = previous.get("agent", "profile")
    if "profile" not in opts.given and isinstance(profile, str) and profile:
        changes["profile"] = profile
    port = previous.get("http", "port")
    if "http_port" not in opts.given and isinstance(port, int) and not isinstance(port, bool):
        changes["http_port"] = port
    device_id = previous.get("agent", "device_id")
    if opts.device_id is None and isinstance(device_id, str) and device_id:
        changes["device_id"] = device_id
    return replace(opts, **changes)


def _pipelines_over(
    opts: SetupOptions,
    previous: Previous | None,
    cameras: list[CameraEntry],
    bundle: BundleEntry | None,
    report: SetupReport,
) -> tuple[BundleEntry | None, list[dict[str, Any]] | None]:
    """The bundle setup's pipelines run, or the previous pipelines kept as they were.

    Raises:
        SetupError: a kept pipeline reads a camera the new cameras drop.
    """
    old = previous.tables("pipelines") if previous is not None else []
    if previous is None or not old:
        return bundle, None
    names = ", ".join(str(p.get("name", "?")) for p in old)
    if bundle is not None:
        report.done.append(f"replaced the previous pipelines ({names}) with --bundle's")
        return bundle, None
    if not opts.cameras:
        return None, old
    made = previous.setup_bundle()
    if made is not None:  # setup's own: one per camera, on the new cameras now
        name, path = made
        try:
            version = str(load_bundle(path).manifest.version)
        except EdgefleetError:
            version = ""
        report.done.append(f"made the pipelines on bundle {name} again for the new cameras")
        return BundleEntry(name, version, path), None
    lost = lost_pipelines(previous, {c.name for c in cameras})
    if lost:
        raise SetupError(
            "--camera",
            f"the pipelines {', '.join(lost)} of {previous.path} read a camera the new "
            "cameras drop; nothing changed (give --bundle for new pipelines, or edit them)",
        )
    return None, old


def setup_device(opts: SetupOptions, read_token: Callable[[], str]) -> SetupReport:
    """Configure this device (see the module docstring); ``read_token`` is called only
    when enrolling.

    Raises:
        SetupError: bad input (nothing written), or a step that failed (named).
    """
    previous = None
    if opts.config.exists():
        if not opts.force:
            raise SetupError(
                str(opts.config), "exists; nothing changed (give --force to write it again)"
            )
        previous = read_previous(opts.config)
    opts = _with_previous(opts, previous)
    chosen = _profile(opts.profile)
    device_id = _device_id(opts.device_id)
    report = SetupReport(str(opts.config), device_id, chosen.name, chosen.reason)
    cameras, camera_tables = _cameras(opts, report, previous)
    bundle, pipeline_tables = _pipelines_over(
        opts, previous, cameras, _bundle(opts, chosen.name), report
    )
    if bundle is not None and not cameras:
        raise SetupError(f"--bundle {opts.bundle}", "no camera to run it on (give --camera)")
    owner = resolve_owner(opts.owner)
    plan = DevicePlan(
        device_id,
        opts.state_dir,
        chosen.name,
        chosen.reason,
        opts.http_port,
        cameras,
        bundle,
        opts.fleet or "",
        previous,
        camera_tables,
        pipeline_tables,
    )
    try:
        text = render(plan)
    except ValueError as exc:
        raise SetupError("config", str(exc)) from None
    try:
        check(text, opts.config)
    except EdgefleetError as exc:
        raise SetupError("config", " ".join(str(exc).split())) from None
    have, needed = enrollment(opts, device_id)
    identity = have if opts.fleet else kept_enrollment(opts, device_id, previous, report)
    if needed:
        token = read_token().strip()
        if not token:
            raise SetupError(
                "--token",
                f"needed to enroll with {opts.fleet}, and none was given (the one-time "
                "token from fleetctl devices enroll; --token - reads it from stdin)",
            )
        identity = enroll_device(opts, device_id, token, replace=have is not None)
        report.done.append(f"enrolled {device_id} with {opts.fleet}")
    elif identity is not None:
        report.done.append(f"kept the enrollment with {identity.server_url}")
    if previous is not None and previous.kept_sections():
        kept = ", ".join(f"[{k}]" for k in previous.kept_sections())
        report.done.append(f"kept from the previous config: {kept}")
    _write(opts, report, plan, text, owner, chosen)
    if identity is not None:
        cert = identity.check()
        report.enrolled = {
            "server": identity.server_url,
            "broker": f"{identity.broker_host}:{identity.broker_port}",
            "certificate_until": f"{cert.not_valid_after_utc:%Y-%m-%d}",
            "fleet_profile": identity.profile,
        }
        if identity.profile and identity.profile != chosen.name:
            report.warnings.append(
                f"the fleet registered {device_id} with profile {identity.profile}, this "
                f"device runs {chosen.name}: rollouts address the fleet's; give --profile "
                f"{identity.profile} (or fix the fleet's record)"
            )
    report.problems += _check_config(opts.config)
    report.next_steps.append("systemctl restart edgefleet-agent")
    return report


def _write(
    opts: SetupOptions,
    report: SetupReport,
    plan: DevicePlan,
    text: str,
    owner: Owner,
    chosen: ChosenProfile,
) -> None:
    """Step 4 of the module docstring."""
    try:
        # No agent secret is generated today; the directory is there for the unit's
        # LoadCredential= and for secrets a config names (first: it is the likeliest to
        # be refused to a user who is not root).
        make_dirs(opts.credentials_dir.parent, mode=0o755)
        make_dirs(opts.credentials_dir, mode=0o700)
        report.credentials_dir = str(opts.credentials_dir)
        make_dirs(opts.state_dir.parent, mode=0o755)  # the service user passes through
        make_dirs(opts.state_dir, mode=0o750)
        if plan.bundle is not None and opts.bundle is not None:
            make_dirs(plan.bundle.path.parent, mode=0o755)
            copied = copy_bundle(opts.bundle, plan.bundle.path)
            verb = "copied" if copied else "kept"
            b = plan.bundle
            report.done.append(f"{verb} bundle {b.name} {b.version} to {b.path}")
            report.bundle = {"name": b.name, "version": b.version, "path": str(b.path)}
        for cam in plan.cameras:
            report.cameras.append({"name": cam.name, "kind": cam.kind, "uri": cam.uri})
        write_config(opts.config, text, gid=owner.gid if os.geteuid() == 0 else None)
        report.done.append(f"wrote {opts.config} (mode 0640)")
        if opts.dropin_dir is not None:
            path = dropin.write_dropin(chosen.profile, opts.dropin_dir)
            report.dropin = str(path)
            limits = f"MemoryMax={dropin.memory_max_mb(chosen.profile)}M"
            report.done.append(f"wrote {path} ({limits})")
            if opts.dropin_dir == dropin.DEFAULT_DIR and dropin.systemd_running():
                why = dropin.daemon_reload()
                report.done.append(why or "reloaded systemd (systemctl daemon-reload)")
        _chown_dir(opts.state_dir, owner)
        for sub in ("identity", "trust", LOCAL_BUNDLES):  # what setup writes there
            _chown_tree(opts.state_dir / sub, owner)
        report.owner = owner.name
    except OSError as exc:
        raise SetupError("write", f"{exc.filename or ''}: {exc.strerror or exc}") from exc


def _chown_dir(path: Path, owner: Owner) -> None:
    if os.geteuid() == 0:
        os.chown(path, owner.uid, owner.gid)


def _check_config(config: Path) -> list[str]:
    """``edge-agent check-config``'s checks on the written file: its problems."""
    try:
        cfg = load_config(config)
    except EdgefleetError as exc:
        return [" ".join(str(exc).split())]
    _, problems = plan_pipelines(cfg)
    return [f"{p.part}: {p.reason}" for p in problems]


def group_name(gid: int) -> str:
    """The name of group ``gid`` (the number when it has none)."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


__all__ = ["SetupError", "SetupOptions", "SetupReport", "setup_device"]
