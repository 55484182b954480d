"""The base of every agent configuration model: unknown keys are refused.

Each subsystem declares its own section model next to its code (``agent/capture/config.py``
and so on); :mod:`agent.config` composes them and turns validation errors into
:class:`agent.kernel.errors.ConfigError` naming the file and the dotted field.

Every number has bounds: no NaN or infinity anywhere (``allow_inf_nan=False``), and the
shared limits below for sizes, durations and counts, so that a typo such as
``budget_mb = 1e30`` or ``workers = 100000`` is refused at load, naming the field, instead
of overflowing or exhausting the device at run time.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

MAX_MB = 16 * 1024 * 1024
"""The largest size or budget in MiB any field takes: 16 TiB."""
MAX_WORKERS = 256
"""The most worker processes one pool may run."""
MAX_TIMEOUT_S = 86_400.0
"""The longest timeout, window or poll interval in seconds: one day."""
MAX_QUEUE = 1_000_000
"""The most items any in-memory queue may hold."""


class Section(BaseModel):
    """A configuration section: unknown keys are an error, values are immutable, and no
    number may be NaN or infinite."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def dotted(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the dotted field name a user reads: ``a.b[2].c``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
