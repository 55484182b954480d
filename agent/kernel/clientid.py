"""MQTT client ids no other client can guess.

Mosquitto hands a session to the newest connection with its client id, so a client that
knows another's id can take its session over (kick it, again and again). Where the broker
binds the id to the certificate (``use_username_as_clientid``, on by default for the
managed broker now that every client holds one connection per certificate) that can't
happen; for a broker that does not (an external one), each connection's id ends in a
secret only its holder has: a digest of its own private key.
The id is the same at every start (a persistent session carries on) and tells nobody
anything about the key (SHA-256, domain-separated, 96 bits shown).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

_DOMAIN = b"edgefleet mqtt client id v1\n"
MAX_KEY_BYTES = 64 * 1024
"""A private key file larger than this is not read (a PEM key is a few hundred bytes)."""


def secret_client_id(prefix: str, key_file: Path) -> str:
    """``<prefix>-<24 hex>``: the hex a digest of the private key at ``key_file`` and
    ``prefix``; stable for one key, unguessable without it. A key that can't be read
    gives a random suffix (a clean session at each start) and a warning."""
    try:
        with key_file.open("rb") as f:
            key = f.read(MAX_KEY_BYTES + 1)
    except OSError as exc:
        log.warning("client id of %s: %s unreadable (%s); a random one", prefix, key_file, exc)
        return f"{prefix}-{uuid.uuid4().hex[:24]}"
    digest = hashlib.sha256(_DOMAIN + prefix.encode("utf-8") + b"\n" + key).hexdigest()
    return f"{prefix}-{digest[:24]}"
