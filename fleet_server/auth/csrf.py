"""Cross-site request forgery checks: pure functions on header values.

A request that changes something (:data:`UNSAFE_METHODS`) and is signed in by the
session cookie must carry the session's CSRF token (synchronizer token pattern), in the
``X-CSRF-Token`` header or, from an HTML form (``application/x-www-form-urlencoded``),
in the ``csrf_token`` field. When the browser names where the request comes from
(``Origin``, else ``Referer``), that must be the server's own origin or a trusted one.
Requests with the operator's bearer token carry no cookie a browser could add on its
own, and need neither.
"""

from __future__ import annotations

import hmac
import urllib.parse
from collections.abc import Iterable

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
HEADER = "X-CSRF-Token"
FORM_FIELD = "csrf_token"
FORM_TYPE = "application/x-www-form-urlencoded"
MAX_FORM_BYTES = 64 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}


def tokens_match(expected: str, given: str | None) -> bool:
    """Whether ``given`` is the session's token (compared in constant time)."""
    if not given:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


def origin_of(url: str) -> str | None:
    """``scheme://host:port`` of ``url``, lower case, port always written (None when
    ``url`` is not an http(s) URL with a host)."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port or _DEFAULT_PORTS[scheme]}"


def origin_refusal(
    origin: str | None, referer: str | None, own: str, trusted: Iterable[str] = ()
) -> str | None:
    """Why a state-changing request from ``origin`` (else ``referer``) is refused, or
    None when it is the server's own origin ``own`` or one of ``trusted``, or when the
    request names no origin at all (not a browser's cross-site request)."""
    allowed = {o for o in (origin_of(u) for u in (own, *trusted)) if o is not None}
    if origin is not None:
        source, what = origin, "Origin"
    elif referer:
        source, what = referer, "Referer"
    else:
        return None
    if origin_of(source) in allowed:
        return None
    return f"cross-site request refused ({what} {source!r} is not this server)"


def form_token(content_type: str | None, body: bytes) -> str | None:
    """The ``csrf_token`` field of a URL-encoded form body (None for another body, a
    body over :data:`MAX_FORM_BYTES`, or no such field)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != FORM_TYPE or len(body) > MAX_FORM_BYTES:
        return None
    try:
        fields = urllib.parse.parse_qs(body.decode("utf-8"), max_num_fields=1000)
    except (UnicodeDecodeError, ValueError):
        return None
    values = fields.get(FORM_FIELD)
    return values[0] if values else None
