"""The firmware profile schema: one device class's core pinning, workers, execution
providers and budgets, as a typed model that forbids unknown keys.

Each field's description doubles as the documentation of the profile format.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
)

log = logging.getLogger(__name__)

TfliteDelegate = Literal["gpu", "xnnpack", "edgetpu"]

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
# platform.machine() spells some architectures differently per OS.
_MACHINE_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}


def normalize_machine(machine: str) -> str:
    """``machine`` as the profiles spell it: lowercase, with OS aliases unified."""
    lowered = machine.strip().lower()
    return _MACHINE_ALIASES.get(lowered, lowered)


def _unique(values: Iterable[str], what: str) -> None:
    seen: set[str] = set()
    for value in values:
        key = value.casefold()
        if key in seen:
            raise ValueError(f"{what} {value!r} is listed twice")
        seen.add(key)


class MatchRule(BaseModel):
    """How ``load_profile("auto")`` recognises the device class."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_tree_model: tuple[StrictStr, ...] = Field(
        default=(),
        description=(
            "Substrings of /proc/device-tree/model (case-insensitive), e.g. "
            '"Jetson AGX Orin". A match here beats any machine match; if several '
            "profiles match, the longest substring wins."
        ),
    )
    machine: tuple[StrictStr, ...] = Field(
        default=(),
        description=(
            'platform.machine() values ("aarch64", "x86_64"; "arm64" and "amd64" are '
            "read as those) for which this profile is the fallback when no profile's "
            "device_tree_model matches."
        ),
    )

    @field_validator("device_tree_model", "machine")
    @classmethod
    def _check_entries(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        for entry in value:
            if not entry.strip():
                raise ValueError("entries must not be empty")
        _unique(value, "entry")
        if info.field_name == "machine":
            return tuple(normalize_machine(entry) for entry in value)
        return value


class ProcessesConfig(BaseModel):
    """How the agent's processes are scheduled on this device (the ``[processes]`` table).

    The agent's supervisor reads it when it splits the hot path from its companion: the
    hot path (capture, pipelines, the runtime's workers or inline sessions) runs above
    everything else, the companion (uplink, installer, HTTP, stats) below it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    hotpath_nice: StrictInt = Field(
        default=0,
        ge=-20,
        le=19,
        description=(
            "Niceness of the hot-path process (capture, pipelines, policy, actions, the "
            "decision-log writer). Below 0 needs CAP_SYS_NICE; 0 leaves it as started."
        ),
    )
    companion_nice: StrictInt = Field(
        default=10,
        ge=0,
        le=19,
        description=(
            "Niceness of the companion process (uplink, directives and installer, local "
            "HTTP, stats), 0..19: higher yields more CPU to the hot path."
        ),
    )
    standby_hotpath: StrictBool = Field(
        default=True,
        description=(
            "Keep a second hot-path process started and waiting (interpreter and imports "
            "done, ~100 MB) so that a hot path that dies is replaced in the time its pool "
            "and cameras take to start, not a new interpreter's too."
        ),
    )
    hotpath_core: Literal["shared", "reserved"] = Field(
        default="shared",
        description=(
            '"reserved": the hot path\'s own threads (capture, pipeline feeders and '
            "deciders, stations, PLC links, the decision-log writer) get cores no worker "
            'holds, so a station\'s deadline does not wait for one: with cores = "all" '
            "and more than two cores, the first (the workers get the rest); with a list, "
            'the cores the list leaves out. "shared": the hot path\'s threads float '
            "over every core."
        ),
    )
    companion_sched: Literal["other", "batch", "idle"] = Field(
        default="batch",
        description=(
            'Linux scheduling policy of the companion process: "other" (SCHED_OTHER, '
            'the default timesharing), "batch" (SCHED_BATCH: never preempts a waking '
            'hot-path thread) or "idle" (SCHED_IDLE: runs only on an otherwise idle core).'
        ),
    )


VideoDecoder = Literal["software", "v4l2m2m", "vaapi", "gstreamer"]


class VideoConfig(BaseModel):
    """How the agent decodes its cameras' video (``[video]`` table)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decoders: tuple[VideoDecoder, ...] = Field(
        default=("software",),
        description=(
            "Video decoders for RTSP and file cameras, best first; each one that can't "
            "run here (no device node, no program, a failed open) is passed over with a "
            "log line, and software (OpenCV's FFmpeg, in process) is always the last "
            "resort. v4l2m2m: the SoC's V4L2 memory-to-memory decoder through OpenCV's "
            "FFmpeg (h264_v4l2m2m, hevc_v4l2m2m; Raspberry Pi 4). vaapi: an ffmpeg "
            "process with -hwaccel vaapi on vaapi_device (Intel and AMD GPUs). "
            "gstreamer: a gst-launch-1.0 process with gst_decoder (nvv4l2decoder on "
            "Jetson), RTSP cameras only."
        ),
    )
    vaapi_device: StrictStr = Field(
        default="/dev/dri/renderD128",
        description="The DRM render node the vaapi decoder opens.",
    )
    gst_decoder: StrictStr = Field(
        default="nvv4l2decoder",
        pattern=r"^[a-z0-9_]+$",
        description="The GStreamer decoder element of the gstreamer decoder.",
    )
    gst_convert: StrictStr = Field(
        default="nvvidconv ! video/x-raw,format=BGRx",
        pattern=r"^$|^[a-z0-9_]+( ! [A-Za-z0-9_/,=.:()-]+)*$",
        description=(
            "The GStreamer elements (joined by ' ! ') between gst_decoder and videoconvert "
            "that copy frames out of device memory (on Jetson nvvidconv, then BGRx caps; "
            '"" for none).'
        ),
    )


class Profile(BaseModel):
    """One device class: core pinning, workers, execution providers and budgets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StrictStr = Field(
        description=(
            "Profile name: lowercase letters, digits, '.', '_' and '-'. A bundled "
            "profile's name equals its file name without .toml."
        ),
    )
    description: StrictStr = Field(
        description="What device class this is for and why its values are what they are.",
    )
    match: MatchRule = Field(
        default_factory=MatchRule,
        description="How auto detection recognises this device class (empty: never auto).",
    )
    cores: Literal["all"] | tuple[int, ...] = Field(
        description=(
            'CPU ids to pin workers to, or "all" for every core this process may use '
            "(os.sched_getaffinity). Ids this device lacks are dropped at start with a "
            "warning."
        ),
    )
    workers: Literal["auto"] | int = Field(
        description=(
            'Number of worker processes (>= 1), or "auto" for one per resolved core. '
            "Never more workers than resolved cores."
        ),
    )
    threads_per_worker: StrictInt = Field(
        default=1,
        ge=1,
        description="Intra-op threads of each worker's inference session.",
    )
    execution_providers: tuple[StrictStr, ...] = Field(
        min_length=1,
        description=(
            "ONNX Runtime execution providers, best first: full names "
            '("CUDAExecutionProvider") or short aliases ("cuda"). Ones this build '
            "lacks are skipped at load time; CPU is always the last resort."
        ),
    )
    tflite_delegates: tuple[TfliteDelegate, ...] = Field(
        default=("xnnpack",),
        description=(
            "LiteRT/TFLite delegates, best first (gpu, xnnpack, edgetpu); empty runs "
            "the built-in reference kernels."
        ),
    )
    memory_budget_mb: StrictInt = Field(
        gt=0,
        description="Memory the runtime may use for models, sessions and slots, in MiB.",
    )
    spin_wait: StrictBool = Field(
        default=False,
        description=(
            "Let idle intra-op threads spin instead of sleeping: lower latency, a busy "
            "core. Off unless measured to help on this device."
        ),
    )
    queue_bound: StrictInt = Field(
        default=8,
        ge=1,
        description=(
            "Default bound on requests waiting per model; a request beyond it is "
            "refused at once (Overloaded), never queued."
        ),
    )
    heartbeat_timeout_s: StrictFloat = Field(
        default=1.0,
        gt=0,
        description=(
            "A worker silent this long is stuck: the watchdog kills and replaces it. "
            "The worker beats every min(0.2 s, timeout/4) while idle and before each "
            "request, so this must exceed the slowest single inference."
        ),
    )
    execution_mode: Literal["pool", "inline"] = Field(
        default="pool",
        description=(
            'How models run: "pool" (worker processes pinned to cores, tensors in shared '
            'memory; a crash costs a worker, not the line) or "inline" (each pipeline '
            "thread runs its sessions itself, pinned to a core of its own: no process "
            "hop, for one camera per core). Chosen from measurements: ADR 0007."
        ),
    )
    pipelining: StrictBool = Field(
        default=True,
        description=(
            "Pool mode: keep one request queued ahead at each busy worker, so a loaded "
            "worker never idles for a round trip."
        ),
    )
    handoff_spin_us: StrictInt = Field(
        default=0,
        ge=0,
        le=10_000,
        description=(
            "Pool mode: microseconds a worker spins (yielding its core) for its next "
            "request before it blocks; 0 blocks at once. Spinning keeps the core awake, "
            "so the next request skips a sleeping core's wake-up, at the cost of a busy "
            "core while the line is idle for less than this."
        ),
    )
    processes: ProcessesConfig = Field(
        default_factory=ProcessesConfig,
        description=(
            "Scheduling of the agent's hot-path and companion processes ([processes] table)."
        ),
    )
    video: VideoConfig = Field(
        default_factory=VideoConfig,
        description="How camera video is decoded ([video] table).",
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME_RE.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a profile name (lowercase letters, digits, '.', '_', '-')"
            )
        return value

    @field_validator("description")
    @classmethod
    def _check_description(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    # The "before" validators below see the raw TOML value and raise ValueError (the
    # only error pydantic reports as a validation error, hence the TRY004 waivers), so a
    # bad value gives one message naming the field instead of one per union member.

    @field_validator("cores", mode="before")
    @classmethod
    def _check_cores(cls, value: object) -> object:
        if value == "all":
            return value
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise ValueError(f'must be a list of CPU ids or "all", got {value!r}')  # noqa: TRY004
        if not value:
            raise ValueError('must list at least one CPU id (or be "all")')
        seen: set[int] = set()
        for index, core in enumerate(value):
            if isinstance(core, bool) or not isinstance(core, int):
                raise ValueError(f"cores[{index}] must be an integer CPU id, got {core!r}")  # noqa: TRY004
            if core < 0:
                raise ValueError(f"cores[{index}] must be >= 0, got {core}")
            if core in seen:
                raise ValueError(f"CPU id {core} is listed twice")
            seen.add(core)
        return tuple(value)

    @field_validator("workers", mode="before")
    @classmethod
    def _check_workers_value(cls, value: object) -> object:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f'must be an integer >= 1 or "auto", got {value!r}')  # noqa: TRY004
        if value < 1:
            raise ValueError(f'must be >= 1 (or "auto"), got {value}')
        return value

    @field_validator("workers")
    @classmethod
    def _check_workers_fit_cores(
        cls, value: Literal["auto"] | int, info: ValidationInfo
    ) -> Literal["auto"] | int:
        cores = info.data.get("cores")
        if isinstance(value, int) and isinstance(cores, tuple) and value > len(cores):
            raise ValueError(
                f"{value} workers but only {len(cores)} cores listed; each worker is "
                "pinned to a core of its own"
            )
        return value

    @field_validator("execution_providers")
    @classmethod
    def _check_providers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for index, provider in enumerate(value):
            if not provider.strip() or provider != provider.strip():
                raise ValueError(f"execution_providers[{index}] {provider!r} is not a name")
        _unique(value, "execution provider")
        return value

    @field_validator("tflite_delegates")
    @classmethod
    def _check_delegates(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        _unique(value, "delegate")
        return value

    def resolve_cores(self, available: set[int] | None = None) -> list[int]:
        """The cores workers are pinned to on this device.

        Args:
            available: the cores this process may use; by default
                ``os.sched_getaffinity(0)``.

        With ``[processes] hotpath_core = "reserved"`` and more than two cores, the first
        is left out (it is the hot path's, :meth:`hotpath_cpu`).
        ``"all"`` gives every available core, sorted. An explicit list keeps its order
        and drops the cores that are not available, with a warning; if none is left
        (a 12-core profile on a 2-core test machine) every available core is used,
        with a warning.

        Raises:
            ValueError: ``available`` is empty.
        """
        return self._resolve_cores(available, warn=True)

    def hotpath_cpus(self, available: set[int] | None = None) -> set[int] | None:
        """The cores kept for the hot path's own threads with ``[processes] hotpath_core
        = "reserved"``: with ``cores = "all"`` and more than two cores, the first one
        (the workers get the rest); with a list of cores, the available ones the list
        leaves out (capture's and the system's). None: nothing reserved.

        Raises:
            ValueError: ``available`` is empty.
        """
        if self.processes.hotpath_core != "reserved":
            return None
        have = _available_cores() if available is None else set(available)
        if not have:
            raise ValueError("no CPU cores are available to this process")
        if self.cores == "all":
            cores = sorted(have)
            return {cores[0]} if self._reserves(cores) else None
        left = have - set(self._all_cores(have, warn=False))
        return left or None

    def _reserves(self, cores: list[int]) -> bool:
        return self.cores == "all" and self.processes.hotpath_core == "reserved" and len(cores) > 2

    def resolve_workers(self, available: set[int] | None = None) -> int:
        """The number of workers on this device: one per resolved core for ``"auto"``,
        otherwise ``workers`` capped (with a warning) at the number of resolved cores.

        Raises:
            ValueError: ``available`` is empty.
        """
        cores = self._resolve_cores(available, warn=False)
        if self.workers == "auto":
            return len(cores)
        if self.workers > len(cores):
            log.warning(
                "profile %s: %d workers wanted but only %d cores resolved (%s); running %d workers",
                self.name,
                self.workers,
                len(cores),
                _format_cores(cores),
                len(cores),
            )
            return len(cores)
        return self.workers

    def _resolve_cores(self, available: set[int] | None, *, warn: bool) -> list[int]:
        cores = self._all_cores(available, warn=warn)
        return cores[1:] if self._reserves(cores) else cores

    def _all_cores(self, available: set[int] | None, *, warn: bool) -> list[int]:
        have = _available_cores() if available is None else set(available)
        if not have:
            raise ValueError("no CPU cores are available to this process")
        if self.cores == "all":
            return sorted(have)
        kept = [core for core in self.cores if core in have]
        missing = [core for core in self.cores if core not in have]
        if not kept:
            if warn:
                log.warning(
                    "profile %s: none of its cores (%s) is available here (have %s); "
                    "using all available cores",
                    self.name,
                    _format_cores(self.cores),
                    _format_cores(sorted(have)),
                )
            return sorted(have)
        if missing and warn:
            log.warning(
                "profile %s: cores %s are not available here (have %s); using %s",
                self.name,
                _format_cores(missing),
                _format_cores(sorted(have)),
                _format_cores(kept),
            )
        return kept


_workers_may_use: set[int] | None = None


def keep_cores_for_workers(cores: set[int]) -> None:
    """Resolve workers' cores from ``cores`` in this process from now on, not from its own
    affinity: the hot path narrows its affinity to its reserved core
    (``hotpath_core = "reserved"``) and still hands the other cores to its workers."""
    global _workers_may_use  # noqa: PLW0603 - one fact per process, set once at its start
    _workers_may_use = set(cores)


def _available_cores() -> set[int]:
    if _workers_may_use is not None:
        return set(_workers_may_use)
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))  # pragma: no cover - not Linux


def _format_cores(cores: Iterable[int]) -> str:
    return ",".join(str(core) for core in cores) or "none"
