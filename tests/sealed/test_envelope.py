"""The sealed envelope: known-answer vectors (frozen in tests/fixtures/sealed), an
independent decryption of them with ``cryptography``'s primitives alone, and the
keyring's typed errors and text forms."""

from __future__ import annotations

import base64
import hmac
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from statekeeper.codec import StateTamperedError, WrongKeyError
from statekeeper.errors import InvalidInputError, SchemaVersionError
from statekeeper.stores.sealed.keyring import Keyring, bindings, seal_with_nonce

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "sealed" / "vectors.json").read_text()
)
VECTORS = FIXTURE["vectors"]


def ring_of(vector: dict[str, Any]) -> Keyring:
    return Keyring({vector["key_id"]: base64.b64decode(vector["key"])})


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_known_answer(vector: dict[str, Any]) -> None:
    ring = ring_of(vector)
    binding = bindings(*vector["binding"])
    plaintext = vector["plaintext"].encode()
    nonce = None if vector["nonce"] is None else bytes.fromhex(vector["nonce"])
    version = vector.get("version", 1)
    sealed = seal_with_nonce(ring, plaintext, binding, nonce, version=version)
    assert sealed == vector["sealed"]
    assert ring.open(vector["sealed"], binding) == plaintext


def derive(key: bytes, purpose: bytes) -> bytes:
    info = b"statekeeper sealed store v1 " + purpose
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(key)


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vectors_decrypt_with_the_primitives_alone(vector: dict[str, Any]) -> None:
    """The format as the module docstring describes it, read without statekeeper's code."""
    data = base64.b64decode(vector["sealed"])
    key = base64.b64decode(vector["key"])
    key_id = vector["key_id"].encode()
    deterministic = vector["nonce"] is None
    header_end = 3 + len(key_id)
    version = vector.get("version", 1)
    assert data[:header_end] == bytes((version, 0 if deterministic else 1, len(key_id))) + key_id
    nonce = data[header_end : header_end + 12]
    associated = data[:header_end] + b"".join(
        len(p.encode()).to_bytes(4, "big") + p.encode() for p in vector["binding"]
    )
    plaintext = vector["plaintext"].encode()
    if deterministic:
        expected = hmac.digest(derive(key, b"nonce"), associated + plaintext, "sha256")[:12]
        assert nonce == expected
    else:
        assert nonce == bytes.fromhex(vector["nonce"])
    cipher = AESGCM(derive(key, b"aes-gcm"))
    assert cipher.decrypt(nonce, data[header_end + 12 :], associated) == plaintext


def test_deterministic_only_when_asked() -> None:
    ring = Keyring({"k": Keyring.new_key()})
    binding = bindings("entry", "t", "s", "e", "message")
    assert ring.seal(b"x", binding, deterministic=True) == ring.seal(
        b"x", binding, deterministic=True
    )
    assert ring.seal(b"x", binding, deterministic=False) != ring.seal(
        b"x", binding, deterministic=False
    )


def test_every_byte_is_authenticated() -> None:
    vector = VECTORS[1]
    ring, binding = ring_of(vector), bindings(*vector["binding"])
    data = base64.b64decode(vector["sealed"])
    for i in range(len(data)):
        changed = bytearray(data)
        changed[i] ^= 0x01
        with pytest.raises((StateTamperedError, SchemaVersionError)):
            ring.open(base64.b64encode(bytes(changed)).decode(), binding)
    with pytest.raises(StateTamperedError, match="truncated"):
        ring.open(base64.b64encode(data[:10]).decode(), binding)
    with pytest.raises(StateTamperedError):
        ring.open("not base64!", binding)


def test_version_1_values_still_open_and_new_ones_are_version_2() -> None:
    old = VECTORS[0]
    assert base64.b64decode(old["sealed"])[0] == 1
    ring, binding = ring_of(old), bindings(*old["binding"])
    assert ring.open(old["sealed"], binding) == old["plaintext"].encode()
    # An entry's version 1 binding is given as the legacy one; version 2 uses the other.
    bound = binding + bindings(3, 2)
    assert ring.open(old["sealed"], bound, binding) == old["plaintext"].encode()
    assert ring.open_or_none(old["sealed"], bound, binding) == old["plaintext"].encode()
    new = ring.seal(b"x", bound, deterministic=True)
    assert (ring.version_of(new), ring.version_of(old["sealed"])) == (2, 1)
    assert ring.open(new, bound, binding) == b"x"
    with pytest.raises(StateTamperedError, match="failed authentication"):
        ring.open(new, binding + bindings(4, 2), binding)  # moved to another seq
    # A version 2 value passed off as version 1 (to be opened unbound) fails.
    data = bytearray(base64.b64decode(new))
    data[0] = 1
    downgraded = base64.b64encode(bytes(data)).decode()
    with pytest.raises(StateTamperedError, match="failed authentication"):
        ring.open(downgraded, bound, binding)


def test_newer_envelope_asks_for_an_upgrade() -> None:
    data = bytearray(base64.b64decode(VECTORS[0]["sealed"]))
    data[0] = 9
    with pytest.raises(SchemaVersionError, match="upgrade statekeeper"):
        ring_of(VECTORS[0]).open(base64.b64encode(bytes(data)).decode(), [])


def test_rotation_seals_with_the_new_key_and_opens_with_both() -> None:
    old = Keyring({"k1": Keyring.new_key()})
    binding = bindings("record", "t", "ns", "k")
    before = old.seal(b"v1", binding, deterministic=False)
    new = old.rotated("k2")
    after = new.seal(b"v2", binding, deterministic=False)
    assert (new.key_id_of(before), new.key_id_of(after)) == ("k1", "k2")
    assert new.open(before, binding) == b"v1"
    with pytest.raises(WrongKeyError, match="'k2'"):
        old.open(after, binding)
    assert new.without("k1").key_ids == ("k2",)
    with pytest.raises(InvalidInputError, match="current key"):
        new.without("k2")


def test_text_form_round_trips_and_errors_never_show_a_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ring = Keyring({"k1": Keyring.new_key(), "k0": Keyring.new_key()}, current="k1")
    monkeypatch.setenv("SK_RING", ring.to_json())
    loaded = Keyring.from_source("env:SK_RING")
    assert loaded.key_ids == ("k1", "k0")
    binding = bindings("x")
    assert loaded.open(ring.seal(b"v", binding, deterministic=True), binding) == b"v"
    path = tmp_path / "ring.json"
    path.write_text(ring.to_json())
    assert Keyring.from_source(f"file:{path}").current == "k1"
    secret = base64.b64encode(Keyring.new_key()).decode()
    for bad in (secret, f"key:{secret}", "env:", "env:SK_MISSING"):
        with pytest.raises(InvalidInputError) as caught:
            Keyring.from_source(bad)
        assert secret[:8] not in str(caught.value)
    monkeypatch.setenv("SK_BAD", json.dumps({"keys": {"k": secret[:10]}}))
    with pytest.raises(InvalidInputError, match="SK_BAD") as caught:
        Keyring.from_source("env:SK_BAD")
    assert secret[:8] not in str(caught.value)
    assert repr(ring) == "Keyring(current='k1', key_ids=('k1', 'k0'))"


@pytest.mark.parametrize(
    ("keys", "current", "problem"),
    [
        ({}, None, "at least one key"),
        ({"k": b"short"}, None, "32 random bytes"),
        ({"k": "a string"}, None, "32 random bytes"),
        ({"bad id!": bytes(32)}, None, "key id"),
        ({"k": bytes(32)}, "other", "not in the keyring"),
    ],
)
def test_bad_keyrings_are_refused(keys: Any, current: str | None, problem: str) -> None:
    with pytest.raises(InvalidInputError, match=problem):
        Keyring(keys, current)


def test_the_fast_base64_reads_what_binascii_reads() -> None:
    # Opening uses pybase64 when installed: it must accept and refuse what binascii does.
    import binascii

    from statekeeper.stores.sealed.keyring import _unbase64

    data = bytes(range(256)) * 3
    text = binascii.b2a_base64(data, newline=False).decode()
    assert _unbase64(text) == data == binascii.a2b_base64(text)
    spaced = text[:10] + "\n" + text[10:]
    assert _unbase64(spaced) == binascii.a2b_base64(spaced)
    for bad in ("abc", "a===="):
        try:
            expected: bytes | None = binascii.a2b_base64(bad)
        except binascii.Error:
            expected = None
        try:
            got: bytes | None = _unbase64(bad)
        except binascii.Error:
            got = None
        assert got == expected, bad
