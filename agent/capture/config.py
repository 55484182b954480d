"""The ``[[cameras]]`` section: one capture source and how to keep it running."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator

from agent.capture.genicam.config import GenicamConfig
from agent.kernel.configbase import Section

CameraKind = Literal["v4l2", "rtsp", "http", "file", "images", "synthetic", "genicam"]

_URL_SCHEMES: dict[str, tuple[str, ...]] = {
    "rtsp": ("rtsp://", "rtsps://"),
    "http": ("http://", "https://"),
}

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class CameraConfig(Section):
    """One camera: where frames come from, how fast, and how a lost source is retried."""

    name: str = Field(
        pattern=NAME_PATTERN,
        max_length=64,
        description="Unique camera name; letters, digits, '_', '.', '-' (used in topics).",
    )
    kind: CameraKind = Field(
        description=(
            "Source kind: v4l2 (local device), rtsp, http (MJPEG), file (a video), "
            "images (a directory of images), synthetic (a generated test pattern), "
            "genicam (a GigE Vision or USB3 Vision camera, through Aravis)."
        )
    )
    uri: str = Field(
        "",
        validate_default=True,
        description=(
            "Device path (/dev/video0) or index (0) for v4l2; rtsp:// or http(s):// URL; "
            "video file path; image directory; empty for synthetic; genicam: the "
            "camera's serial number, its Aravis id (Vendor-Model-Serial) or its IP "
            "address (as `edge-agent cameras` lists them), or a GigE Vision camera's "
            "user id (DeviceUserID)."
        ),
    )
    detect_uri: str = Field(
        "",
        description=(
            "RTSP: the camera's low-resolution sub-stream (e.g. 640x360), read instead of "
            "uri for detection and thumbnails; decoding it costs a fraction of the main "
            "stream. uri stays the main stream's address (not opened by the agent)."
        ),
    )
    fps: float = Field(
        10.0,
        gt=0,
        le=1000,
        description=(
            "Target frames per second. File, image and synthetic sources are read at "
            "this pace; live sources are read as fast as they deliver, at most this "
            "many frames per second are published."
        ),
    )
    loop: bool = Field(
        True, description="Start over at the end of a video file or image directory."
    )
    trigger_mode: Literal["free_run", "software", "hardware"] = Field(
        "free_run",
        description=(
            "`free_run`: read at `fps`. `software`: read one frame each time the agent "
            "fires the camera's software trigger (a station with capture = "
            '"software_trigger"); file, image, synthetic and genicam sources (genicam: '
            "TriggerSoftware). `hardware`: genicam only, the camera takes a frame on "
            "its input line (genicam.trigger_source) and the agent reads each one."
        ),
    )
    phase: float = Field(
        0.0,
        ge=0,
        lt=1,
        description=(
            "File, image and synthetic sources: the first read waits this fraction of a "
            "frame period, so that cameras at the same fps take turns on the workers "
            "instead of capturing at the same instant (a trigger offset: 0, 0.25, 0.5, "
            "0.75 for four cameras). Live sources ignore it."
        ),
    )
    width: int = Field(
        640, ge=16, le=16384, description="Synthetic frame width; requested width for v4l2."
    )
    height: int = Field(
        480, ge=16, le=16384, description="Synthetic frame height; requested height for v4l2."
    )
    pattern: Literal["bars", "checker", "noise"] = Field(
        "bars", description="Synthetic pattern: a moving bar, a moving checkerboard, or noise."
    )
    stall_timeout_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description=(
            "A source that delivers no frame for this long is closed and reopened; also "
            "the read timeout given to OpenCV for network streams."
        ),
    )
    open_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="Longest wait for a network stream to open (OpenCV open timeout).",
    )
    backoff_initial_s: float = Field(
        0.5, gt=0, le=3600, description="First wait before reopening a failed source."
    )
    backoff_max_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        validate_default=True,
        description="Longest wait between reopen attempts; the wait doubles up to this.",
    )
    line: str = Field("", description="Production line this camera watches (for policy).")
    transport: Literal["tcp", "udp", "auto"] = Field(
        "tcp",
        description=(
            "RTSP: how the video travels: tcp (interleaved in the RTSP connection; the "
            "default, it passes NAT and firewalls and loses nothing), udp (lower latency "
            "on a clean network, loses frames on a busy one), or auto (FFmpeg's choice: "
            "UDP first, then TCP)."
        ),
    )
    decoder: Literal["auto", "software", "v4l2m2m", "vaapi", "gstreamer"] = Field(
        "auto",
        description=(
            "RTSP: the video decoder; auto takes the firmware profile's [video] decoders, "
            "best first. A decoder that can't run falls back to software (OpenCV's "
            "FFmpeg) with a log line; the one running is in the camera's stats."
        ),
    )
    keyframes_only: bool = Field(
        False,
        description=(
            "RTSP: decode only the key frames (an ffmpeg process with -skip_frame nokey), "
            "one per GOP, at a fraction of the CPU: for a pipeline that needs a frame "
            "every second or two. Needs Debian's ffmpeg; without it every frame is decoded."
        ),
    )
    damaged_frames: Literal["keep", "skip"] = Field(
        "keep",
        description=(
            "RTSP: what to do with a frame decoded while the decoder reported damage "
            "(lost packets, a decode error, a concealed hole): keep (publish it, counted) "
            "or skip (not published, counted). Damage is counted by an ffmpeg decoder "
            "child: a camera with transport udp or auto, or with skip, decodes in one "
            "(needs Debian's ffmpeg; vaapi and keyframes_only run one anyway)."
        ),
    )
    genicam: GenicamConfig | None = Field(
        None,
        description=(
            "genicam: the features set at open and read back ([cameras.genicam]: "
            "pixel_format, exposure_us, gain, frame_rate, roi, binning, packet_size, "
            "packet_delay_ns, trigger_source, buffers, features)."
        ),
    )
    username: str = Field(
        "",
        max_length=256,
        description="RTSP/HTTP user name; its password comes from password_env.",
    )
    password_env: str = Field(
        "",
        pattern=r"^$|^[A-Za-z_][A-Za-z0-9_]*$",
        max_length=128,
        description=(
            "Name of the secret holding the camera's password: a file of that name in "
            "$CREDENTIALS_DIRECTORY (systemd LoadCredential), else the environment "
            "variable. Never the password itself."
        ),
    )

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, uri: str, info: ValidationInfo) -> str:
        kind = info.data.get("kind")
        if kind is None or kind == "synthetic":
            return uri
        if not uri:
            raise ValueError(f"uri is required for a camera of kind {kind!r}")
        schemes = _URL_SCHEMES.get(kind)
        if schemes and not uri.lower().startswith(schemes):
            raise ValueError(
                f"uri {uri!r} of a {kind} camera must start with {' or '.join(schemes)}"
            )
        if schemes and _has_password(uri):
            raise ValueError(
                "uri carries a password in clear; put the user in 'username' and the "
                "password in a secret named by 'password_env' (a file in "
                "$CREDENTIALS_DIRECTORY or an environment variable)"
            )
        if schemes:
            _check_port(uri, "uri")
        return uri

    @field_validator("backoff_max_s")
    @classmethod
    def _check_backoff(cls, backoff_max_s: float, info: ValidationInfo) -> float:
        initial = info.data.get("backoff_initial_s")
        if initial is not None and backoff_max_s < initial:
            raise ValueError(
                f"backoff_max_s ({backoff_max_s}) is less than backoff_initial_s ({initial})"
            )
        return backoff_max_s

    @property
    def genicam_config(self) -> GenicamConfig:
        """The ``[cameras.genicam]`` table (its defaults when the config has none)."""
        return self.genicam or GenicamConfig()

    @property
    def stream_uri(self) -> str:
        """The stream the camera reads: ``detect_uri`` when set, else ``uri``."""
        return self.detect_uri or self.uri

    @model_validator(mode="after")
    def _check_credentials(self) -> CameraConfig:
        if self.detect_uri:
            if self.kind != "rtsp":
                raise ValueError("detect_uri applies to rtsp cameras only")
            if not self.detect_uri.lower().startswith(_URL_SCHEMES["rtsp"]):
                raise ValueError("detect_uri must start with rtsp:// or rtsps://")
            _check_port(self.detect_uri, "detect_uri")
            if _has_password(self.detect_uri):
                raise ValueError(
                    "detect_uri carries a password in clear; put the user in 'username' and "
                    "the password in a secret named by 'password_env'"
                )
        if self.password_env and not self.username:
            raise ValueError("password_env is set but username is empty")
        if (self.username or self.password_env) and self.kind not in _URL_SCHEMES:
            raise ValueError(
                f"username and password_env apply to rtsp and http cameras, not {self.kind}"
            )
        if self.username and any("@" in urlsplit(u).netloc for u in (self.uri, self.detect_uri)):
            raise ValueError("the user is given twice: in uri and in username; keep username")
        if self.kind != "rtsp" and (self.decoder != "auto" or self.keyframes_only):
            raise ValueError(
                f"decoder and keyframes_only apply to rtsp cameras only, not {self.kind} "
                "(other kinds decode in software)"
            )
        if self.kind != "rtsp" and self.damaged_frames != "keep":
            raise ValueError(f"damaged_frames applies to rtsp cameras only, not {self.kind}")
        if self.genicam is not None and self.kind != "genicam":
            raise ValueError(f"[cameras.genicam] applies to genicam cameras, not {self.kind}")
        if self.trigger_mode == "hardware" and self.kind != "genicam":
            raise ValueError(
                f"trigger_mode = 'hardware' applies to genicam cameras, not {self.kind}"
            )
        if (
            self.kind == "genicam"
            and self.trigger_mode != "free_run"
            and self.genicam_config.frame_rate is not None
        ):
            raise ValueError(
                "genicam.frame_rate applies to a free_run camera; a triggered camera takes "
                "a frame per trigger"
            )
        if self.trigger_mode == "software" and self.kind not in SOFTWARE_TRIGGER_KINDS:
            raise ValueError(
                f"trigger_mode = 'software' applies to {', '.join(SOFTWARE_TRIGGER_KINDS)} "
                f"cameras, not {self.kind} (a live stream can't be triggered)"
            )
        return self


SOFTWARE_TRIGGER_KINDS = ("synthetic", "file", "images", "genicam")
"""Camera kinds the agent reads one frame at a time on a software trigger."""


def counts_damage(config: CameraConfig) -> bool:
    """Whether the camera's video is decoded where its damage can be counted (an ffmpeg
    child): it travels over UDP (transport udp or auto), or its damaged frames are skipped."""
    return config.kind == "rtsp" and (config.transport != "tcp" or config.damaged_frames == "skip")


def _check_port(uri: str, name: str) -> None:
    """Raises ValueError: ``uri`` names a port that is not 1-65535 (or not a number)."""
    try:
        port = urlsplit(uri).port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"{name} {uri!r} names a port that is not 1-65535")


def _has_password(uri: str) -> bool:
    try:
        return urlsplit(uri).password is not None
    except ValueError:
        return False
