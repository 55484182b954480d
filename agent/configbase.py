"""The base of every agent configuration model: unknown keys are refused.

Each subsystem declares its own section model next to its code (``agent/capture/config.py``
and so on); :mod:`agent.config` composes them and turns validation errors into
:class:`agent.errors.ConfigError` naming the file and the dotted field.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A configuration section: unknown keys are an error, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)
