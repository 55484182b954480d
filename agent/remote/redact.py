"""Secrets out of what leaves the device: log lines, the configuration and the health
in a diagnostics archive.

:class:`Redactor` replaces with ``***``:

- every secret this process knows by value: the secrets it holds
  (:func:`agent.kernel.secrets.held_values`), the contents of each file in
  ``$CREDENTIALS_DIRECTORY`` (systemd credentials), and any given, as they are and as a
  URL writes them (percent-encoded);
- the password of a URL (``rtsp://user:***@host``), as the camera code redacts it
  (:func:`agent.capture.sources.redact` does one URL; this does it inside any text);
- the value of a ``key=value``, ``key: value`` or JSON ``"key": "value"`` whose key names
  a secret (password, passphrase, token, secret, api key, private key, authorization,
  credentials, session id), and the token of ``Bearer <token>``;
- a PEM private key block.

It counts what it replaced, so a report can say how much was taken out.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from agent.kernel import secrets

MASK = "***"
MIN_SECRET_CHARS = 4
"""A secret shorter than this is not replaced by value (it would blank common words);
the key=value and URL rules still take it out."""
MAX_CREDENTIAL_BYTES = 64 * 1024

_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s/@:'\"]*):[^\s/@'\"]*@")
_SECRET_KEY = (
    r"[\w.-]*(?:pass(?:word|wd|phrase)?|pwd|secret|token|api[_-]?key|access[_-]?key|"  # noqa: S105 - key names
    r"private[_-]?key|authorization|credentials?|session[_-]?id)[\w.-]*"
)
_KEY_VALUE = re.compile(
    rf"(?i)(?P<key>{_SECRET_KEY})(?P<q>[\"']?)(?P<sep>\s*[=:]\s*)"
    r"(?P<val>\"[^\"]*\"|'[^']*'|[^\s&,;\"'}\]]+)"
)
_WHOLE_KEY = re.compile(f"(?i){_SECRET_KEY}")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}")
_PEM = re.compile(r"-----BEGIN ([A-Z ]*PRIVATE KEY)-----.*?(?:-----END \1-----|$)", re.DOTALL)


def credential_values(directory: str | Path | None) -> list[str]:
    """The text of each file in ``directory`` (``$CREDENTIALS_DIRECTORY``), stripped;
    a file that can't be read, or is larger than :data:`MAX_CREDENTIAL_BYTES`, is left
    out (its name is no secret; its text never leaves through here unread)."""
    if not directory:
        return []
    out = []
    try:
        entries = sorted(Path(directory).iterdir())
    except OSError:
        return []
    for path in entries:
        try:
            if not path.is_file() or path.stat().st_size > MAX_CREDENTIAL_BYTES:
                continue
            text = path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            continue
        if text:
            out.append(text)
    return out


class Redactor:
    """Takes secrets out of text (see the module docstring).

    Args:
        extra: more secret values to take out (a test's, a config's).
        credentials_dir: where systemd put the credentials (default
            ``$CREDENTIALS_DIRECTORY``).
    """

    def __init__(
        self, extra: Iterable[str] = (), *, credentials_dir: str | Path | None = None
    ) -> None:
        directory = credentials_dir or os.environ.get("CREDENTIALS_DIRECTORY")
        values = {*secrets.held_values(), *credential_values(directory), *extra}
        forms: set[str] = set()
        for value in values:
            for raw in value.splitlines() or [value]:
                line = raw.strip()
                if len(line) >= MIN_SECRET_CHARS:
                    forms |= {line, quote(line, safe=""), quote(line)}
        # longest first: a secret that holds another is replaced whole
        self._values = sorted(forms, key=len, reverse=True)
        self.replaced = 0
        """How many secrets were replaced in all the text seen so far."""

    def __call__(self, text: str) -> str:
        """``text`` without the secrets."""
        for value in self._values:
            if value in text:
                self.replaced += text.count(value)
                text = text.replace(value, MASK)
        text, n = _PEM.subn(lambda m: f"-----BEGIN {m[1]}----- {MASK}", text)
        self.replaced += n
        text, n = _URL_PASSWORD.subn(rf"\1:{MASK}@", text)
        self.replaced += n
        text, n = _BEARER.subn(rf"\1 {MASK}", text)
        self.replaced += n
        text, n = _KEY_VALUE.subn(_masked, text)
        self.replaced += n
        return text

    def value(self, value: Any) -> Any:
        """``value`` (parsed JSON: the configuration, a health report) with the secrets
        taken out: a string under a key that names a secret is replaced whole (not one
        whose key ends in ``_env``: that names where a secret is, never holds it), every
        other string as text."""
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                name = str(key)
                if (
                    isinstance(item, str)
                    and item
                    and _WHOLE_KEY.fullmatch(name)
                    and not name.endswith(secrets.NAMES_SECRET_SUFFIX)
                ):
                    self.replaced += 1
                    out[key] = MASK
                else:
                    out[key] = self.value(item)
            return out
        if isinstance(value, list | tuple):
            return [self.value(item) for item in value]
        if isinstance(value, str):
            return self(value)
        return value


def _masked(match: re.Match[str]) -> str:
    value = match["val"]
    if value == MASK or value.strip("\"'") == MASK:
        return match[0]
    shown = f"{value[0]}{MASK}{value[0]}" if value[:1] in ("'", '"') else MASK
    return f"{match['key']}{match['q']}{match['sep']}{shown}"
