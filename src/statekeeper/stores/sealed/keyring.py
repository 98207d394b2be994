"""Keys and the envelope of sealed values: AES-256-GCM from ``cryptography``.

A `Keyring` holds named 32-byte keys, one of them *current*: new values are sealed with
the current key, and a value sealed with any key of the ring opens. Each key is split with
HKDF-SHA256 into an AES-256-GCM key (info ``statekeeper sealed store v1 aes-gcm``) and a
nonce key (info ``... nonce``), so a key also used with `statekeeper.codec.StateCodec`
never serves two purposes.

A sealed value is the standard base64 of::

    offset  size  field
    0       1     envelope version (2; 1 is still read)
    1       1     mode: 0 deterministic, 1 randomized
    2       1     key id length n (1..128)
    3       n     key id (ASCII, an id as `statekeeper.ids.validate_id` allows)
    3+n     12    nonce
    15+n    ...   AES-GCM ciphertext, then the 16-byte tag

The associated data is the header (bytes 0..3+n) followed by each part of the value's
*binding*, each as a 4-byte big-endian length and its bytes. The binding names what the
value is and where it lives (tenant, owner, field), so a value copied anywhere else fails
authentication. Version 2 changed one binding, the transcript entry's, which also names
the entry's seq and parent seq (``SealedStore`` passes both bindings to `Keyring.open`,
which picks the one of the value's version); version 1 values still open.

The nonce is random in randomized mode. In deterministic mode it is synthetic:
HMAC-SHA256(nonce key, associated data || plaintext), cut to 12 bytes, so the same key,
binding and plaintext always give the same bytes (and different plaintexts collide no
more often than random nonces do). Transcript entries use it, so that a retried append
is recognised by the store as identical (idempotent replay compares stored payloads);
only the equality of an entry with its own retry is visible.

Errors (from `statekeeper.codec`): `StateTamperedError` when a value fails
authentication or is malformed, `WrongKeyError` when its key id is not in the ring.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from statekeeper.codec import KEY_SIZE, StateTamperedError, WrongKeyError
from statekeeper.errors import InvalidInputError, MissingExtraError, SchemaVersionError
from statekeeper.ids import validate_id

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

try:  # SIMD base64 (the `crypto` extra installs it): binascii's is most of an open's cost
    from pybase64 import b64decode as _b64decode

    def _unbase64(text: str) -> bytes:
        # validate=False: the same leniency as binascii.a2b_base64 (the tag checks all).
        return _b64decode(text, validate=False)

except ImportError:  # pragma: no cover - the extra installs it

    def _unbase64(text: str) -> bytes:
        return binascii.a2b_base64(text)


__all__ = ["SEALED_VERSION", "Keyring", "bindings", "seal_with_nonce"]

SEALED_VERSION: Final = 2
"""The envelope version this module writes (and the newest it reads): 2 since a transcript
entry is also bound to its seq and parent seq; version 1 values still open."""
_READ_VERSIONS: Final = (1, 2)
_DETERMINISTIC: Final = 0
_RANDOMIZED: Final = 1
_NONCE_SIZE: Final = 12
_TAG_SIZE: Final = 16
_HKDF_INFO: Final = b"statekeeper sealed store v1 "


class _Key:
    """One key of a ring, ready to use: its cipher, nonce key and encoded header."""

    __slots__ = ("cipher", "headers", "key_id", "nonce_key", "read_headers")

    def __init__(self, key_id: str, key: bytes) -> None:
        self.key_id = key_id
        try:
            from cryptography.hazmat.primitives import hashes
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
            from cryptography.hazmat.primitives.kdf.hkdf import HKDF
        except ImportError:
            raise MissingExtraError("encryption at rest", "crypto") from None

        def derive(purpose: bytes) -> bytes:
            hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO + purpose)
            return hkdf.derive(key)

        self.cipher: AESGCM = AESGCM(derive(b"aes-gcm"))
        self.nonce_key = derive(b"nonce")
        encoded = key_id.encode("ascii")
        self.headers = tuple(
            bytes((SEALED_VERSION, mode, len(encoded))) + encoded
            for mode in (_DETERMINISTIC, _RANDOMIZED)
        )
        """The headers it writes, by mode."""
        self.read_headers = tuple(
            bytes((version, mode, len(encoded))) + encoded
            for version in _READ_VERSIONS
            for mode in (_DETERMINISTIC, _RANDOMIZED)
        )
        """Every header of a value it opens."""


def _check_key(key: object, key_id: str) -> bytes:
    # Never show the key itself: only its type and length.
    if not isinstance(key, bytes | bytearray) or len(key) != KEY_SIZE:
        size = f"{len(key)} bytes" if isinstance(key, bytes | bytearray) else type(key).__name__
        raise InvalidInputError(
            f"key {key_id!r} must be {KEY_SIZE} random bytes, got {size}; "
            "make one with Keyring.new_key()"
        )
    return bytes(key)


class Keyring:
    """Named keys for sealing a store; ``current`` seals, all of them open.

    Args:
        keys: ``key id -> 32 random bytes`` (ids: letters, digits and ``. _ : @ -``).
        current: the key id new values are sealed with (default: the first of ``keys``).

    Raises:
        InvalidInputError: no keys, a bad key id, a key that is not 32 bytes, or a
            ``current`` that is not among ``keys``.
        MissingExtraError: the ``crypto`` extra is not installed.
    """

    __slots__ = ("_by_header", "_ciphers", "_current", "_keys")

    def __init__(self, keys: Mapping[str, bytes], current: str | None = None) -> None:
        if not isinstance(keys, Mapping) or not keys:
            raise InvalidInputError(
                "a keyring needs at least one key: Keyring({'k1': Keyring.new_key()})"
            )
        self._keys = {validate_id(k, "key id"): _check_key(v, k) for k, v in keys.items()}
        for key_id in self._keys:
            if len(key_id.encode("ascii")) > 128:
                raise InvalidInputError(f"key id {key_id[:40]!r}... is longer than 128 characters")
        self._current = next(iter(self._keys)) if current is None else current
        if self._current not in self._keys:
            raise InvalidInputError(
                f"current key id {self._current!r} is not in the keyring "
                f"(it has {', '.join(map(repr, self._keys))})"
            )
        self._ciphers = {k: _Key(k, v) for k, v in self._keys.items()}
        # header bytes -> key: opening finds the key with one lookup (it runs per row read)
        self._by_header = {h: key for key in self._ciphers.values() for h in key.read_headers}

    @staticmethod
    def new_key() -> bytes:
        """A new random 32-byte key."""
        return os.urandom(KEY_SIZE)

    @property
    def current(self) -> str:
        """The key id new values are sealed with."""
        return self._current

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key id of the ring, current first."""
        return (self._current, *(k for k in self._keys if k != self._current))

    def __repr__(self) -> str:  # never the keys
        return f"Keyring(current={self._current!r}, key_ids={self.key_ids!r})"

    def rotated(self, key_id: str, key: bytes | None = None) -> Keyring:
        """This ring with ``key`` (a new random one if None) added as the current key."""
        if key_id in self._keys:
            raise InvalidInputError(f"key id {key_id!r} is already in the keyring")
        added = _check_key(Keyring.new_key() if key is None else key, key_id)
        return Keyring({key_id: added, **self._keys}, current=key_id)

    def without(self, *key_ids: str) -> Keyring:
        """This ring without the given (old) keys, once no value is sealed with them."""
        if self._current in key_ids:
            raise InvalidInputError(f"cannot drop the current key {self._current!r}")
        kept = {k: v for k, v in self._keys.items() if k not in key_ids}
        return Keyring(kept, current=self._current)

    # -- text form ---------------------------------------------------------------------

    def to_json(self) -> str:
        """The ring as JSON text, ``{"current": id, "keys": {id: base64}}``. It holds the
        keys: keep it where secrets go (a secret manager, a 0600 file), never in a URL."""
        keys = {k: base64.b64encode(v).decode() for k, v in self._keys.items()}
        return json.dumps({"current": self._current, "keys": keys})

    @classmethod
    def from_json(cls, text: str, *, source: str = "keyring text") -> Keyring:
        """The ring `to_json` wrote. Errors name ``source``, never a key."""
        try:
            data = json.loads(text)
            keys = {str(k): base64.b64decode(v, validate=True) for k, v in data["keys"].items()}
            current = data.get("current")
        except (ValueError, TypeError, KeyError, AttributeError, binascii.Error):
            raise InvalidInputError(
                f"{source} is not a keyring: expected JSON like "
                '{"current": "k1", "keys": {"k1": "<base64 of 32 bytes>"}}'
            ) from None
        return cls(keys, current if isinstance(current, str) else None)

    @classmethod
    def from_source(cls, source: str) -> Keyring:
        """The ring named by ``env:VARIABLE`` or ``file:PATH`` (never the keys themselves)."""
        kind, _, name = source.partition(":")
        if kind == "env" and name:
            text = os.environ.get(name)
            if not text:
                raise InvalidInputError(f"environment variable {name} holds no keyring")
            return cls.from_json(text, source=f"environment variable {name}")
        if kind == "file" and name:
            try:
                text = Path(name).read_text(encoding="utf-8")
            except OSError as exc:
                raise InvalidInputError(
                    f"cannot read keyring file {name}: {exc.strerror}"
                ) from None
            return cls.from_json(text, source=f"keyring file {name}")
        # Never echo ``source``: it may be a key someone pasted in the wrong place.
        raise InvalidInputError(
            "a keyring source must be env:VARIABLE or file:PATH (a key is never written "
            "in a URL or on a command line)"
        )

    # -- sealing -------------------------------------------------------------------------

    def seal(self, plaintext: bytes, binding: bytes, *, deterministic: bool) -> str:
        """``plaintext`` sealed with the current key, bound to ``binding``."""
        nonce = None if deterministic else os.urandom(_NONCE_SIZE)
        return seal_with_nonce(self, plaintext, binding, nonce)

    def key_id_of(self, sealed: str) -> str:
        """The key id a sealed value names (`StateTamperedError` if it is malformed)."""
        try:
            data = binascii.a2b_base64(sealed)
        except (binascii.Error, ValueError, TypeError):
            raise _damaged("it is not base64") from None
        return _parse(data)[1]

    def version_of(self, sealed: str) -> int:
        """The envelope version of a sealed value (`StateTamperedError` if malformed)."""
        try:
            data = binascii.a2b_base64(sealed)
        except (binascii.Error, ValueError, TypeError):
            raise _damaged("it is not base64") from None
        return _parse(data)[0][0]

    def open(self, sealed: str, binding: bytes, legacy: bytes | None = None) -> bytes:
        """The plaintext of ``sealed``, if it is authentic and bound to ``binding`` (or,
        for a value of envelope version 1, to ``legacy`` when it is given: the binding a
        value had before version 2 changed it).

        Raises:
            WrongKeyError: its key id is not in this ring (the message names it).
            StateTamperedError: it was changed, truncated, or moved from elsewhere.
        """
        try:
            data = _unbase64(sealed)
        except (binascii.Error, ValueError, TypeError):
            raise _damaged("it is not base64") from None
        end = 3 + data[2] if len(data) > 3 else 0
        key = self._by_header.get(data[:end])
        if key is None or len(data) < end + _NONCE_SIZE + _TAG_SIZE:
            key = self._key_of(data)  # raises the error that fits
        nonce_end = end + _NONCE_SIZE
        if legacy is not None and data[0] == 1:
            binding = legacy
        try:
            return key.cipher.decrypt(data[end:nonce_end], data[nonce_end:], data[:end] + binding)
        except _invalid_tag():
            raise StateTamperedError(
                f"a stored value sealed with key id {key.key_id!r} failed authentication: it "
                "was changed, or moved from another tenant, session, entry or record; "
                "nothing of it was used - restore it from a backup"
            ) from None

    def open_or_none(
        self, sealed: str, binding: bytes, legacy: bytes | None = None
    ) -> bytes | None:
        """`open` for the transcript load path: the plaintext, or None when the value
        does not open on the first try (then `open` says why)."""
        try:
            data = _unbase64(sealed)
            end = 3 + data[2]
            key = self._by_header[data[:end]]
            nonce_end = end + _NONCE_SIZE
            if len(data) < nonce_end + _TAG_SIZE:
                return None
            if legacy is not None and data[0] == 1:
                binding = legacy
            view = memoryview(data)  # no copies of the ciphertext
            return key.cipher.decrypt(view[end:nonce_end], view[nonce_end:], data[:end] + binding)
        except Exception:  # any failure: `open` raises the error that fits
            return None

    def _key_of(self, data: bytes) -> _Key:
        """The key of a value the fast path did not recognise, or the error it deserves."""
        key_id = _parse(data)[1]
        key = self._ciphers.get(key_id)
        if key is None:
            raise WrongKeyError(
                f"a stored value is sealed with key id {key_id!r}, which this keyring does "
                f"not have (it has {', '.join(map(repr, self.key_ids))}); add that key to the "
                "keyring. If the key is lost, the values sealed with it cannot be recovered"
            )
        return key


def seal_with_nonce(
    keyring: Keyring,
    plaintext: bytes,
    binding: bytes,
    nonce: bytes | None,
    *,
    version: int = SEALED_VERSION,
) -> str:
    """`Keyring.seal` with a given nonce (None: deterministic, the synthetic nonce) and
    envelope version. For known-answer tests; use `Keyring.seal`, which draws a random
    nonce."""
    key = keyring._ciphers[keyring.current]
    if version not in _READ_VERSIONS:
        raise InvalidInputError(f"envelope versions are {_READ_VERSIONS}")
    mode = _DETERMINISTIC if nonce is None else _RANDOMIZED
    header = key.read_headers[_READ_VERSIONS.index(version) * 2 + mode]
    associated = header + binding
    if nonce is None:
        nonce = hmac.digest(key.nonce_key, associated + plaintext, "sha256")[:_NONCE_SIZE]
    elif len(nonce) != _NONCE_SIZE:
        raise InvalidInputError(f"a nonce is {_NONCE_SIZE} bytes")
    body = key.cipher.encrypt(nonce, plaintext, associated)
    return binascii.b2a_base64(header + nonce + body, newline=False).decode("ascii")


_INVALID_TAG: list[type[Exception]] = []


def _invalid_tag() -> type[Exception]:
    if not _INVALID_TAG:  # imported once, not on every open (this runs per entry read)
        from cryptography.exceptions import InvalidTag

        _INVALID_TAG.append(InvalidTag)
    return _INVALID_TAG[0]


def _parse(data: bytes) -> tuple[bytes, str, bytes, bytes]:
    """(header, key id, nonce, ciphertext and tag) of a sealed value's bytes."""
    if len(data) < 4:
        raise _damaged("it is truncated")
    version, mode, size = data[0], data[1], data[2]
    if version > SEALED_VERSION:
        raise SchemaVersionError(
            f"a stored value is sealed with envelope version {version}, newer than this "
            f"statekeeper (reads up to {SEALED_VERSION}); upgrade statekeeper"
        )
    if version < 1 or mode not in (_DETERMINISTIC, _RANDOMIZED) or size == 0:
        raise _damaged("its header is invalid")
    end = 3 + size
    nonce_end = end + _NONCE_SIZE
    if len(data) < nonce_end + _TAG_SIZE:
        raise _damaged("it is truncated")
    try:
        key_id = validate_id(data[3:end].decode("ascii"), "key id")
    except (UnicodeDecodeError, InvalidInputError):
        raise _damaged("its key id is unreadable") from None
    return data[:end], key_id, data[end:nonce_end], data[nonce_end:]


def _damaged(problem: str) -> StateTamperedError:
    return StateTamperedError(
        f"a stored sealed value is damaged ({problem}); restore it from a backup"
    )


def bindings(*parts: str | int) -> bytes:
    """The binding of a value (what it is and where it lives) as associated data: each
    part as its 4-byte big-endian length and its UTF-8 bytes, so no two bindings look
    alike, and ``bindings(a, b) + bindings(c) == bindings(a, b, c)``."""
    out = bytearray()
    for part in parts:
        data = str(part).encode()
        out += len(data).to_bytes(4, "big")
        out += data
    return bytes(out)
