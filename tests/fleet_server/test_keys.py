"""The keystore: keys generated here, encrypted on disk, passphrases from the environment or
$CREDENTIALS_DIRECTORY, clear errors for a wrong or missing passphrase."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from securesystemslib.exceptions import UnverifiedSignatureError

from fleet_server.errors import KeystoreError, PassphraseError
from fleet_server.repository import ROLES, KeyStore, Passphrases

PASSPHRASE = "keystore test passphrase"  # noqa: S105 (generated keys, test only)


@pytest.fixture
def passphrase(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    for role in ROLES:
        monkeypatch.delenv(f"EDGEFLEET_KEY_PASSPHRASE_{role.upper()}", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    return PASSPHRASE


def test_keystore_holds_three_root_keys_and_one_per_other_role(
    tmp_path: Path, passphrase: str
) -> None:
    store = KeyStore.create(tmp_path / "keys", root_keys=3, root_threshold=2)
    roles = [k.role for k in store.list_keys()]
    assert roles.count("root") == 3
    assert all(roles.count(r) == 1 for r in ROLES[1:])
    assert store.root_threshold == 2
    assert len({k.keyid for k in store.list_keys()}) == len(roles) == 7


def test_private_keys_are_encrypted_pem_readable_only_by_the_owner(
    tmp_path: Path, passphrase: str
) -> None:
    store = KeyStore.create(tmp_path / "keys")
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    for key in store.list_keys():
        pem = key.path.read_bytes()
        assert pem.startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
        assert stat.S_IMODE(key.path.stat().st_mode) == 0o600
        assert passphrase.encode() not in pem
    index = (tmp_path / "keys" / "keystore.json").read_text()
    assert "PRIVATE" not in index
    assert passphrase not in index


def test_signer_from_the_keystore_signs_what_the_listed_public_key_verifies(
    tmp_path: Path, passphrase: str
) -> None:
    KeyStore.create(tmp_path / "keys")
    store = KeyStore(tmp_path / "keys")  # fresh instance: decrypts from disk
    key = store.list_keys("targets")[0]
    (signer,) = store.signers([key.keyid])
    signature = signer.sign(b"payload")
    key.public.verify_signature(signature, b"payload")
    with pytest.raises(UnverifiedSignatureError):
        key.public.verify_signature(signature, b"other payload")


def test_wrong_passphrase_is_a_clear_error_naming_the_key_file(
    tmp_path: Path, passphrase: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    KeyStore.create(tmp_path / "keys")
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", "not the passphrase at all")
    store = KeyStore(tmp_path / "keys")
    key = store.list_keys("snapshot")[0]
    with pytest.raises(KeystoreError, match="wrong passphrase") as err:
        store.signers([key.keyid])
    assert err.value.path == str(key.path)


def test_missing_passphrase_names_where_it_is_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EDGEFLEET_KEY_PASSPHRASE", raising=False)
    monkeypatch.delenv("EDGEFLEET_KEY_PASSPHRASE_ROOT", raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    with pytest.raises(PassphraseError, match="EDGEFLEET_KEY_PASSPHRASE_ROOT") as err:
        KeyStore.create(tmp_path / "keys")
    assert err.value.names == ("EDGEFLEET_KEY_PASSPHRASE_ROOT", "EDGEFLEET_KEY_PASSPHRASE")
    assert not (tmp_path / "keys").exists(), "nothing is written without a passphrase"


def test_short_passphrase_is_refused_for_new_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, passphrase: str
) -> None:
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", "short")
    with pytest.raises(PassphraseError, match="shorter than 12"):
        KeyStore.create(tmp_path / "keys")


def test_root_passphrase_can_differ_and_come_from_credentials_directory(
    tmp_path: Path, passphrase: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "EDGEFLEET_KEY_PASSPHRASE_ROOT").write_text("offline root passphrase\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    KeyStore.create(tmp_path / "keys")
    store = KeyStore(tmp_path / "keys")
    root_ids = [k.keyid for k in store.list_keys("root")]
    assert len(store.signers(root_ids)) == 3
    assert len(store.signers([k.keyid for k in store.list_keys("timestamp")])) == 1

    (creds / "EDGEFLEET_KEY_PASSPHRASE_ROOT").unlink()  # the online passphrase only
    with pytest.raises(KeystoreError, match="cannot decrypt the root key"):
        KeyStore(tmp_path / "keys").signers(root_ids)


def test_passphrase_variable_name_is_configurable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, passphrase: str
) -> None:
    monkeypatch.setenv("LINE7_FLEET_KEYS", "another long passphrase")
    monkeypatch.delenv("EDGEFLEET_KEY_PASSPHRASE")
    names = Passphrases("LINE7_FLEET_KEYS")
    store = KeyStore.create(tmp_path / "keys", passphrases=names)
    assert len(store.signers([k.keyid for k in store.list_keys()])) == 7
    with pytest.raises(PassphraseError):
        Passphrases("bad/name")


def test_threshold_above_the_number_of_root_keys_is_refused(
    tmp_path: Path, passphrase: str
) -> None:
    with pytest.raises(KeystoreError, match="root threshold 4"):
        KeyStore.create(tmp_path / "keys", root_keys=3, root_threshold=4)


def test_an_existing_keystore_is_never_overwritten(tmp_path: Path, passphrase: str) -> None:
    first = KeyStore.create(tmp_path / "keys")
    ids = [k.keyid for k in first.list_keys()]
    with pytest.raises(KeystoreError, match="already holds a keystore"):
        KeyStore.create(tmp_path / "keys")
    assert [k.keyid for k in KeyStore(tmp_path / "keys").list_keys()] == ids


def test_a_key_file_swapped_for_another_is_detected(tmp_path: Path, passphrase: str) -> None:
    store = KeyStore.create(tmp_path / "keys")
    targets, snapshot = store.list_keys("targets")[0], store.list_keys("snapshot")[0]
    targets.path.write_bytes(snapshot.path.read_bytes())
    with pytest.raises(KeystoreError, match="index says"):
        KeyStore(tmp_path / "keys").signers([targets.keyid])


def test_retired_keys_are_listed_only_on_request_and_never_sign(
    tmp_path: Path, passphrase: str
) -> None:
    store = KeyStore.create(tmp_path / "keys")
    old = store.list_keys("director")[0]
    new = store.generate("director")[0]
    store.retire([old.keyid])
    assert [k.keyid for k in store.list_keys("director")] == [new.keyid]
    listed = store.list_keys("director", include_retired=True)
    assert [k.keyid for k in listed] == [old.keyid, new.keyid]
    assert listed[0].retired is not None
    assert store.signers([old.keyid]) == []
    raw = json.loads((tmp_path / "keys" / "keystore.json").read_text())
    assert sum(1 for k in raw["keys"] if k["retired"]) == 1
