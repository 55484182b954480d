"""Drift data on the device: per model version, line, source and bucket (an hour by
default), fixed-bin histograms of what the model saw and said, counted on the decision
log's writer thread and kept in the decision log's ``drift_hours`` table until the uplink
sends each closed bucket to the fleet (:mod:`agent.uplink.quality`).

- :mod:`agent.drift.accumulator`: the pure counting (:class:`DriftAccumulator`).
- :mod:`agent.drift.inputs`: brightness, contrast and sharpness of a frame.
- :mod:`agent.drift.store`: adding counts to the ``drift_hours`` rows.
- :mod:`agent.drift.recorder`: the writer thread's hook (:class:`DriftRecorder`).
- :mod:`agent.drift.config`: the ``[drift]`` section (:class:`DriftConfig`).
"""

from agent.drift.accumulator import DriftAccumulator, HourCounts, Key, Seen, bucket, read_outputs
from agent.drift.config import DriftConfig
from agent.drift.inputs import FrameError, InputStats, input_stats
from agent.drift.recorder import DriftRecorder, DriftStats

__all__ = [
    "DriftAccumulator",
    "DriftConfig",
    "DriftRecorder",
    "DriftStats",
    "FrameError",
    "HourCounts",
    "InputStats",
    "Key",
    "Seen",
    "bucket",
    "input_stats",
    "read_outputs",
]
