"""A GenICam camera's ``[cameras.genicam]`` table: the features set at open and read back.

What can be checked without the camera is checked here (``edge-agent check-config``):
names are GenICam names, values are numbers, booleans or words, ranges are sane, and a
feature with a key of its own (``PixelFormat`` is ``pixel_format``...) is not given twice.
Whether the camera has a feature and takes its value is known only at open
(:mod:`agent.capture.genicam.source`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from agent.kernel.configbase import Section

PixelFormat = Literal["Mono8", "BayerRG8", "BayerGR8", "BayerGB8", "BayerBG8", "RGB8", "BGR8"]

FEATURE_NAME = r"^[A-Za-z][A-Za-z0-9_]{0,127}$"

OWN_KEYS: dict[str, str] = {
    "PixelFormat": "pixel_format",
    "ExposureTime": "exposure_us",
    "ExposureTimeAbs": "exposure_us",
    "Gain": "gain",
    "GainRaw": "gain",
    "AcquisitionFrameRate": "frame_rate",
    "AcquisitionFrameRateAbs": "frame_rate",
    "OffsetX": "roi",
    "OffsetY": "roi",
    "Width": "roi",
    "Height": "roi",
    "BinningHorizontal": "binning",
    "BinningVertical": "binning",
    "GevSCPSPacketSize": "packet_size",
    "GevSCPD": "packet_delay_ns",
    "TriggerMode": "the camera's trigger_mode",
    "TriggerSource": "trigger_source",
    "TriggerSelector": "the camera's trigger_mode",
    "TriggerSoftware": "the camera's trigger_mode",
    "AcquisitionStart": "nothing: the agent starts and stops acquisition",
    "AcquisitionStop": "nothing: the agent starts and stops acquisition",
    "AcquisitionMode": "nothing: the agent acquires continuously",
}
"""Features with a key of their own (or that the agent drives): not in ``features``."""

FeatureValue = bool | int | float | str


class GenicamConfig(Section):
    """A GenICam camera (GigE Vision, USB3 Vision) read through Aravis: which features the
    agent sets at open. Each one is read back; a feature the camera refuses or changes
    is a start-up error naming it and what the camera said. Unset keys leave the camera
    as it is."""

    pixel_format: PixelFormat | None = Field(
        None,
        description=(
            "PixelFormat: Mono8, BayerRG8, BayerGR8, BayerGB8, BayerBG8, RGB8 or BGR8, "
            "converted to the pipeline's BGR. Unset: the camera's own, which must be one "
            "of these."
        ),
    )
    exposure_us: float | None = Field(
        None,
        gt=0,
        le=60_000_000,
        description="Exposure time in µs (ExposureTime, or ExposureTimeAbs on older cameras).",
    )
    gain: float | None = Field(
        None,
        ge=0,
        le=1000,
        description="Gain in the camera's unit (Gain in dB, or GainRaw on older cameras).",
    )
    frame_rate: float | None = Field(
        None,
        gt=0,
        le=10_000,
        description=(
            "AcquisitionFrameRate in frames/s, free_run only. The camera's `fps` stays "
            "the most frames/s the agent publishes: set it at least this high."
        ),
    )
    roi: tuple[int, int, int, int] | None = Field(
        None,
        description=(
            "Region of interest [OffsetX, OffsetY, Width, Height] in pixels (after binning)."
        ),
    )
    binning: tuple[int, int] | None = Field(
        None, description="[BinningHorizontal, BinningVertical], 1 to 16 each."
    )
    packet_size: int | None = Field(
        None,
        ge=576,
        le=16_404,
        description=(
            "GigE Vision: stream packet size in bytes (GevSCPSPacketSize); 9000-byte jumbo "
            "frames need every switch and NIC on the way to take them. Unset: the camera's."
        ),
    )
    packet_delay_ns: int | None = Field(
        None,
        ge=0,
        le=1_000_000_000,
        description=(
            "GigE Vision: the gap between stream packets, in ns (GevSCPD through the "
            "camera's tick frequency): spreads several cameras' bursts on one link."
        ),
    )
    trigger_source: str = Field(
        "Line1",
        pattern=FEATURE_NAME,
        description=(
            'trigger_mode = "hardware": the camera\'s input that triggers a frame '
            "(TriggerSource: Line0, Line1 ...)."
        ),
    )
    buffers: int = Field(
        8,
        ge=2,
        le=64,
        description="Frame buffers Aravis receives into (allocated once at open).",
    )
    features: dict[str, FeatureValue] = Field(
        default_factory=dict,
        description=(
            "Any other GenICam feature, set in this order at open and read back: "
            '{ ExposureAuto = "Off", BalanceWhiteAuto = "Continuous", Gamma = 0.7 }. '
            "SFNC names; an enumeration's entry is a word."
        ),
    )

    @field_validator("roi")
    @classmethod
    def _check_roi(cls, roi: tuple[int, int, int, int] | None) -> tuple[int, int, int, int] | None:
        if roi is None:
            return roi
        x, y, w, h = roi
        if x < 0 or y < 0 or not (1 <= w <= 65_535 and 1 <= h <= 65_535):
            raise ValueError(f"roi {list(roi)}: offsets must be >= 0 and width and height 1-65535")
        return roi

    @field_validator("binning")
    @classmethod
    def _check_binning(cls, binning: tuple[int, int] | None) -> tuple[int, int] | None:
        if binning is not None and not all(1 <= b <= 16 for b in binning):
            raise ValueError(f"binning {list(binning)}: each must be 1-16")
        return binning

    @field_validator("features")
    @classmethod
    def _check_features(cls, features: dict[str, FeatureValue]) -> dict[str, FeatureValue]:
        import re  # noqa: PLC0415 - only when a config has features

        if len(features) > 256:
            raise ValueError(f"features: {len(features)} given, at most 256")
        for name, value in features.items():
            if not re.match(FEATURE_NAME, name):
                raise ValueError(
                    f"features: {name!r} is not a GenICam feature name (a letter, then "
                    "letters, digits or '_', at most 128)"
                )
            if name in OWN_KEYS:
                raise ValueError(f"features: {name} is set by {OWN_KEYS[name]}, not here")
            if isinstance(value, str) and (
                len(value) > 256 or not value.isprintable() or not value.strip()
            ):
                raise ValueError(
                    f"features.{name}: {value!r} is not a value a camera takes (printable "
                    "text, 1-256 characters)"
                )
        return features


def feature_text(value: FeatureValue) -> str:
    """A ``features`` value as the text Aravis sets it from (``true``/``false``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
