"""The base of every wire-format model: unknown fields are kept, values are immutable.

Wire formats are read by agents older and newer than the writer, so unlike configuration
(which forbids unknown keys) they keep what they don't know and write it back unchanged.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

_SLUG = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$")


class WireModel(BaseModel):
    """Base of every wire model: unknown fields are kept, values are immutable."""

    model_config = ConfigDict(extra="allow", frozen=True)


def slug(value: str, what: str) -> str:
    """``value`` if it is a slug (names of bundles, profiles, formats), else ValueError."""
    if not _SLUG.match(value):
        raise ValueError(
            f"{value!r} is not a valid {what} (lowercase letters, digits, '.', '_', '-'; "
            "1-64 characters, starting and ending with a letter or digit)"
        )
    return value


def _profile_name(value: str) -> str:
    return slug(value, "profile name")


ProfileName = Annotated[str, AfterValidator(_profile_name)]
