"""The keystore: Ed25519 signing keys for the repository roles, encrypted on disk.

One directory; ``keystore.json`` indexes the keys (role, key id, public key, file, created,
retired) so they can be listed without a passphrase; each private key is its own
``<role>-<keyid[:16]>.pem``, PKCS#8 PEM encrypted with the role's passphrase (mode 0600).
Passphrases come from the environment or ``$CREDENTIALS_DIRECTORY`` (see
:class:`Passphrases`), never from the command line. docs/keys-and-repository.md says which
keys stay offline and how rotation works.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    PrivateFormat,
    load_pem_private_key,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from securesystemslib.signer import (  # type: ignore[attr-defined, unused-ignore]
    CryptoSigner,
    Signer,
    SSlibKey,
)

from agent.kernel.secrets import credential_file
from fleet_server.errors import KeystoreError, PassphraseError
from fleet_server.repository._files import fsync_dir, make_dirs, write_durable

log = logging.getLogger(__name__)

ROLES = ("root", "targets", "snapshot", "timestamp", "director")
"""Roles with keys: the four TUF top-level roles and the director (assignment) role."""

DEFAULT_PASSPHRASE_NAME = "EDGEFLEET_KEY_PASSPHRASE"  # noqa: S105 (a variable name)
INDEX_NAME = "keystore.json"
MIN_PASSPHRASE_CHARS = 12
_MAX_PASSPHRASE_BYTES = 4096
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


@dataclass(frozen=True)
class Passphrases:
    """Where key passphrases come from.

    For role ``r`` the names ``<name>_<R>`` (e.g. ``EDGEFLEET_KEY_PASSPHRASE_ROOT``) and
    then ``<name>`` are tried; for each name, the file ``$CREDENTIALS_DIRECTORY/<name>``
    (systemd credentials) first, then the environment variable. One trailing newline of a
    file is dropped.
    """

    name: str = DEFAULT_PASSPHRASE_NAME
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise PassphraseError(
                "", "", (self.name,), f"passphrase name {self.name!r} is not a variable name"
            )

    def names(self, role: str) -> tuple[str, ...]:
        """The names looked up for ``role``, most specific first."""
        return (f"{self.name}_{role.upper()}", self.name)

    def get(self, role: str, where: str) -> bytes:
        """The passphrase for ``role``'s keys; ``where`` names the keystore in errors.

        Raises:
            PassphraseError: none found, empty, or an unreadable credential file.
        """
        names = self.names(role)
        creds = self.environ.get("CREDENTIALS_DIRECTORY")
        for name in names:
            value: bytes | None = None
            source = f"${name}"
            path = credential_file(creds, name)
            if path is not None:
                source = f"$CREDENTIALS_DIRECTORY/{path.name}"
                value = _read_credential(path, where, role, names)
            elif name in self.environ:
                value = self.environ[name].encode("utf-8")
            if value is not None:
                if not value:
                    raise PassphraseError(where, role, names, f"{source} is empty")
                return value
        raise PassphraseError(
            where,
            role,
            names,
            f"no passphrase for the {role} keys: set {' or '.join(names)} in the "
            "environment or as a file in $CREDENTIALS_DIRECTORY",
        )


def _read_credential(path: Path, where: str, role: str, names: tuple[str, ...]) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_PASSPHRASE_BYTES + 1)
    except OSError as exc:
        raise PassphraseError(where, role, names, f"cannot read {path}: {exc}") from exc
    if len(data) > _MAX_PASSPHRASE_BYTES:
        raise PassphraseError(where, role, names, f"{path} is over {_MAX_PASSPHRASE_BYTES} bytes")
    return data.removesuffix(b"\n").removesuffix(b"\r")


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: str = Field(description="Role the key signs for (root, targets, ..., director).")
    keyid: str = Field(description="TUF key id (sha256 of the canonical public key).")
    file: str = Field(description="Private key file name inside the keystore.")
    public: dict[str, Any] = Field(description="securesystemslib public key dictionary.")
    created: datetime = Field(description="When the key was generated (UTC).")
    retired: datetime | None = Field(None, description="When the key was rotated out.")


class _Index(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int = Field(1, description="Index format version.")
    root_threshold: int = Field(ge=1, description="Root signatures required (new roots).")
    keys: list[_Entry] = Field(default_factory=list, description="Every key, in order made.")


@dataclass(frozen=True)
class KeyInfo:
    """A key of the keystore, public part only."""

    role: str
    keyid: str
    path: Path
    public: SSlibKey
    created: datetime
    retired: datetime | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``fleetctl keys list --json``)."""
        return {
            "role": self.role,
            "keyid": self.keyid,
            "file": str(self.path),
            "keytype": self.public.keytype,
            "public": self.public.keyval.get("public"),
            "created": self.created.isoformat(),
            "retired": self.retired.isoformat() if self.retired else None,
        }


class KeyStore:
    """A directory of encrypted role keys (see the module docstring)."""

    def __init__(self, path: Path, passphrases: Passphrases | None = None) -> None:
        self.path = Path(path)
        self.passphrases = passphrases or Passphrases()
        self._signers: dict[str, CryptoSigner] = {}

    @classmethod
    def create(
        cls,
        path: Path,
        *,
        root_keys: int = 3,
        root_threshold: int = 2,
        passphrases: Passphrases | None = None,
    ) -> KeyStore:
        """Make a new keystore with ``root_keys`` root keys and one key of each other role.

        Raises:
            KeystoreError: the directory already holds a keystore, a bad count or
                threshold, a missing or short passphrase, or a write failure.
        """
        store = cls(path, passphrases)
        if store.exists():
            raise KeystoreError(str(store.path), f"already holds a keystore ({INDEX_NAME})")
        if not 1 <= root_threshold <= root_keys:
            raise KeystoreError(
                str(store.path),
                f"root threshold {root_threshold} must be between 1 and {root_keys} root keys",
            )
        for role in ROLES:  # fail on a missing passphrase before writing anything
            store._new_passphrase(role)
        try:
            make_dirs(store.path, mode=0o700)
            store.path.chmod(0o700)
        except OSError as exc:
            raise KeystoreError(str(store.path), f"cannot create: {exc}") from exc
        store._write_index(_Index(root_threshold=root_threshold))
        store.generate("root", root_keys)
        for role in ROLES[1:]:
            store.generate(role)
        return store

    def exists(self) -> bool:
        """Whether the directory holds a keystore index."""
        return (self.path / INDEX_NAME).is_file()

    def _read_index(self) -> _Index:
        path = self.path / INDEX_NAME
        try:
            raw = json.loads(path.read_bytes())
            return _Index.model_validate(raw)
        except FileNotFoundError:
            raise KeystoreError(
                str(self.path), "no keystore here (create one: fleetctl keys init)"
            ) from None
        except (OSError, ValueError, ValidationError) as exc:
            raise KeystoreError(str(path), f"unreadable index: {exc}") from exc

    def _write_index(self, index: _Index) -> None:
        data = json.dumps(index.model_dump(mode="json"), indent=2).encode() + b"\n"
        try:
            write_durable(self.path / INDEX_NAME, data, mode=0o600)
        except OSError as exc:
            raise KeystoreError(str(self.path), f"cannot write {INDEX_NAME}: {exc}") from exc

    @property
    def root_threshold(self) -> int:
        """Root signatures required by roots made from this keystore."""
        return self._read_index().root_threshold

    def list_keys(self, role: str | None = None, *, include_retired: bool = False) -> list[KeyInfo]:
        """Keys of ``role`` (every role when None), oldest first; retired ones on request."""
        found = []
        for e in self._read_index().keys:
            if (role is None or e.role == role) and (include_retired or e.retired is None):
                public = SSlibKey.from_dict(e.keyid, dict(e.public))
                path = self.path / e.file
                found.append(KeyInfo(e.role, e.keyid, path, public, e.created, e.retired))
        return found

    def public_keys(self, role: str) -> list[SSlibKey]:
        """The active public keys of ``role``."""
        return [k.public for k in self.list_keys(role)]

    def _new_passphrase(self, role: str) -> bytes:
        secret = self.passphrases.get(role, str(self.path))
        if len(secret.decode("utf-8", "replace")) < MIN_PASSPHRASE_CHARS:
            raise PassphraseError(
                str(self.path),
                role,
                self.passphrases.names(role),
                f"the passphrase for new {role} keys is shorter than "
                f"{MIN_PASSPHRASE_CHARS} characters",
            )
        return secret

    def generate(self, role: str, count: int = 1) -> list[KeyInfo]:
        """Generate ``count`` new active keys for ``role``; return them.

        Raises:
            KeystoreError: unknown role, missing or short passphrase, or a write failure.
        """
        if role not in ROLES:
            raise KeystoreError(str(self.path), f"unknown role {role!r} ({', '.join(ROLES)})")
        secret = self._new_passphrase(role)
        index = self._read_index()
        entries = list(index.keys)
        made = []
        for _ in range(count):
            private = Ed25519PrivateKey.generate()
            signer = CryptoSigner(private)
            keyid = signer.public_key.keyid
            name = f"{role}-{keyid[:16]}.pem"
            pem = private.private_bytes(
                Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(secret)
            )
            try:
                write_durable(self.path / name, pem, mode=0o600)
            except OSError as exc:
                raise KeystoreError(str(self.path / name), f"cannot write: {exc}") from exc
            public = signer.public_key.to_dict()
            entry = _Entry(role=role, keyid=keyid, file=name, public=public, created=_now())
            entries.append(entry)
            self._signers[keyid] = signer
            made.append(keyid)
        self._write_index(index.model_copy(update={"keys": entries}))
        return [k for k in self.list_keys(role) if k.keyid in made]

    def retire(self, keyids: Iterable[str]) -> None:
        """Mark keys retired (rotated out); their files stay until the operator deletes them."""
        wanted = set(keyids)
        index = self._read_index()
        stamp = _now()
        entries = [
            e.model_copy(update={"retired": stamp}) if e.keyid in wanted and not e.retired else e
            for e in index.keys
        ]
        self._write_index(index.model_copy(update={"keys": entries}))
        for keyid in wanted:
            self._signers.pop(keyid, None)
        fsync_dir(self.path)

    def signers(self, keyids: Iterable[str]) -> list[Signer]:
        """Signers for the active keys among ``keyids`` this keystore holds, decrypted.

        A key whose file is absent (an offline root key kept elsewhere) is left out; the
        caller checks that enough signed.

        Raises:
            KeystoreError: a key file is unreadable, or the passphrase is wrong.
        """
        wanted = set(keyids)
        found: list[Signer] = []
        for key in self.list_keys():
            if key.keyid not in wanted:
                continue
            if key.keyid not in self._signers and not key.path.exists():
                log.info("%s key %s: %s is not here (offline?)", key.role, key.keyid, key.path)
                continue
            found.append(self._signer(key))
        return found

    def _signer(self, key: KeyInfo) -> CryptoSigner:
        cached = self._signers.get(key.keyid)
        if cached is not None:
            return cached
        secret = self.passphrases.get(key.role, str(self.path))
        try:
            pem = key.path.read_bytes()
        except OSError as exc:
            raise KeystoreError(str(key.path), f"cannot read the {key.role} key: {exc}") from exc
        try:
            private = load_pem_private_key(pem, password=secret)
        except (ValueError, TypeError) as exc:
            names = " or ".join(self.passphrases.names(key.role))
            raise KeystoreError(
                str(key.path),
                f"cannot decrypt the {key.role} key (wrong passphrase in {names}?): {exc}",
            ) from exc
        if not isinstance(private, Ed25519PrivateKey):
            raise KeystoreError(str(key.path), "not an Ed25519 private key")
        signer = CryptoSigner(private)
        if signer.public_key.keyid != key.keyid:
            raise KeystoreError(
                str(key.path), f"holds key {signer.public_key.keyid}, index says {key.keyid}"
            )
        self._signers[key.keyid] = signer
        return signer


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)
