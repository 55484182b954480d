"""A rollout's state to and from JSON, for one database row (or file).

The document is ``{"format": 1, "rollout": {...}}``; enums are their values, times POSIX
seconds. Loading validates every field, so a damaged row is an error, not a bad state.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter, ValidationError

from fleet_server.rollout.errors import RolloutError
from fleet_server.rollout.state import Rollout

FORMAT = 1
_ADAPTER: TypeAdapter[Rollout] = TypeAdapter(Rollout)


def to_dict(rollout: Rollout) -> dict[str, Any]:
    """The rollout as JSON-ready data."""
    return {"format": FORMAT, "rollout": _ADAPTER.dump_python(rollout, mode="json")}


def from_dict(data: Any) -> Rollout:
    """A rollout from :func:`to_dict` data.

    Raises:
        RolloutError: not a rollout document of a known format, or a field is invalid.
    """
    if not isinstance(data, dict) or "rollout" not in data:
        raise RolloutError("state", "not a rollout document ({'format': 1, 'rollout': ...})")
    if data.get("format") != FORMAT:
        raise RolloutError("state.format", f"{data.get('format')!r} is not format {FORMAT}")
    try:
        return _ADAPTER.validate_python(data["rollout"])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in ("state", *first["loc"]))
        raise RolloutError(where, f"{first['msg']} ({exc.error_count()} errors)") from None


def dumps(rollout: Rollout) -> str:
    """The rollout as compact JSON text."""
    return json.dumps(to_dict(rollout), separators=(",", ":"), sort_keys=True)


def loads(text: str | bytes) -> Rollout:
    """A rollout from :func:`dumps` text.

    Raises:
        RolloutError: not JSON, or not a valid rollout document.
    """
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RolloutError("state", f"not JSON: {exc}") from None
    return from_dict(data)
