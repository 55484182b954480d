"""The hasher that per-test fixtures add their users with: the product's argon2id
:class:`~fleet_server.auth.PasswordHasher` with its default parameters, each password
hashed once per process.

A fixture that adds olga, lena and vic to a fresh database for every test would pay for
three argon2id hashes a test (64 MiB and about 0.15 s each on an idle core, several
times that on a loaded CI machine), only to store hashes of one password. The hash it
stores is a real one, made once, and sign-in checks it with the server's own hasher like
any other. Tests of hashing itself (a new password is hashed, a hash with old parameters
is replaced at sign-in) use :class:`~fleet_server.auth.PasswordHasher`.
"""

from __future__ import annotations

import threading

from fleet_server.auth import PasswordHasher


class OncePerPassword(PasswordHasher):
    """A :class:`PasswordHasher` whose :meth:`hash` answers a password it hashed before
    with the same hash (salt included)."""

    def __init__(self) -> None:
        super().__init__()
        self._hashes: dict[str, str] = {}
        self._lock = threading.Lock()

    def hash(self, password: str) -> str:
        with self._lock:
            if password not in self._hashes:
                self._hashes[password] = super().hash(password)
            return self._hashes[password]


USERS_HASHER = OncePerPassword()
"""What the per-test fixtures add their users with."""
