"""Reading a TOML configuration file: size first, then UTF-8, then TOML, one error each.

Both ``edge-agent`` and ``fleet-server`` read their configuration through
:func:`load_toml_file`; the error always names the file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from agent.kernel.errors import ConfigError
from agent.kernel.readlimit import read_at_most
from agent.wire.untrusted import PayloadTooLarge

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

MAX_CONFIG_BYTES = 1 << 20
"""A configuration file larger than this (1 MiB) is refused before it is read whole."""


def parse_toml(text: str, path: str) -> dict[str, Any]:
    """Parse TOML text read from ``path`` (named in the error).

    Raises:
        ConfigError: not valid TOML, or nested too deep for the parser.
    """
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except RecursionError:
        raise ConfigError(path, "", "not valid TOML: nested too deep") from None
    except ValueError as e:  # TOMLDecodeError, and an integer too long to convert
        raise ConfigError(path, "", f"not valid TOML: {e}") from None
    return data


def load_toml_file(path: Path, limit: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """Read and parse the TOML file at ``path``, refusing one over ``limit`` bytes.

    Raises:
        ConfigError: unreadable, too large, not UTF-8 or not valid TOML.
    """
    try:
        text = read_at_most(path, limit, "configuration").decode("utf-8")
    except OSError as e:
        raise ConfigError(str(path), "", f"can't read: {e.strerror or e}") from None
    except PayloadTooLarge as e:
        raise ConfigError(str(path), "", f"{e.size} bytes, over the limit of {e.limit}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(str(path), "", f"not UTF-8 ({e.reason} at byte {e.start})") from None
    return parse_toml(text, str(path))
