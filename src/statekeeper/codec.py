"""Optional compression and authenticated encryption of exported and stored state.

A `StateCodec` turns text (a run state's JSON, say) into bytes and back. What it wrote
says how to read it back: a small envelope header followed by the body.

    offset  size  field
    0       4     magic b"\\x89SKC" (0x89 cannot start UTF-8 text, so plain text never
                  looks like an envelope)
    4       1     envelope format version (1)
    5       1     flags: 0x01 body compressed (zstd), 0x02 body encrypted (AES-256-GCM)
    -- only when encrypted:
    6       1     key id length n (1..128)
    7       n     key id (ASCII, an id as `statekeeper.ids.validate_id` allows)
    7+n     12    nonce (random for every message)
    --
    ...           body: zstd frame, UTF-8 text, or ciphertext followed by the 16-byte tag

Encryption authenticates the whole header as associated data, so a change to any byte
(version, flags, key id, nonce, ciphertext or tag) fails the check and raises
`StateTamperedError`; nothing tampered is ever returned. Compression happens before
encryption. A codec with neither option writes the plain UTF-8 text, no envelope.

A codec that has a key refuses anything that is not encrypted: if it accepted plain
text, whoever can write the store could replace an encrypted state with a plain one of
their choosing (strip the encryption) and it would be read as genuine.

Run states are sealed with a codec in `statekeeper.runs.sealing` (``dump_state``,
``load_state`` and sealed checkpoints); this module knows nothing of runs.

The ``crypto`` extra (``cryptography`` and ``zstandard``) is needed only when a codec
compresses or encrypts, or reads a blob that is compressed or encrypted; the packages
are imported on first use, so the core install works without them.

Errors added here (subclasses of `statekeeper.errors.StoreCorruptError`)::

    StoreCorruptError
    └── StateTamperedError      changed, truncated or not authentic
        └── WrongKeyError       encrypted under a key this codec does not have
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from statekeeper.errors import (
    InvalidInputError,
    InvalidPayloadError,
    MissingExtraError,
    PayloadTooLargeError,
    SchemaVersionError,
    StoreCorruptError,
)
from statekeeper.ids import validate_id

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "ENVELOPE_MAGIC",
    "ENVELOPE_VERSION",
    "KEY_SIZE",
    "StateCodec",
    "StateTamperedError",
    "WrongKeyError",
    "key_from_env",
]

ENVELOPE_MAGIC: Final = b"\x89SKC"
ENVELOPE_VERSION: Final = 1
"""The envelope format this module writes; it reads this one and older ones."""
KEY_SIZE: Final = 32
"""AES-256: keys are 32 random bytes."""

_FLAG_COMPRESSED: Final = 0x01
_FLAG_ENCRYPTED: Final = 0x02
_KNOWN_FLAGS: Final = _FLAG_COMPRESSED | _FLAG_ENCRYPTED
_NONCE_SIZE: Final = 12
_TAG_SIZE: Final = 16
_PREFIX_SIZE: Final = len(ENVELOPE_MAGIC) + 2
_DEFAULT_MAX_SIZE: Final = 256 * 1024 * 1024


class StateTamperedError(StoreCorruptError):
    """Encoded state was changed, truncated, or cannot be shown to be authentic.

    Nothing is returned from such a blob. Restore the state from a backup or an earlier
    checkpoint; if the blob came from elsewhere, ask for it again.
    """


class WrongKeyError(StateTamperedError):
    """Encrypted state names a key id this codec does not have (or it has no key)."""


# -- optional dependencies ---------------------------------------------------------------


def _aesgcm(key: bytes) -> AESGCM:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise MissingExtraError("state encryption", "crypto") from None
    return AESGCM(key)


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError:
        raise MissingExtraError("state compression", "crypto") from None
    return zstandard


# -- keys --------------------------------------------------------------------------------


def _check_key(key: object, what: str) -> bytes:
    # Never put the key itself in a message: only its type and length.
    if not isinstance(key, bytes | bytearray):
        raise InvalidInputError(
            f"{what} must be {KEY_SIZE} raw bytes, got {type(key).__name__}; "
            "make one with StateCodec.generate_key() or read one with key_from_env()"
        )
    if len(key) != KEY_SIZE:
        raise InvalidInputError(
            f"{what} must be {KEY_SIZE} bytes (AES-256), got {len(key)} bytes; "
            "make one with StateCodec.generate_key() or read one with key_from_env()"
        )
    return bytes(key)


def _fingerprint(key: bytes) -> str:
    """A default key id: a short hash of the key (reveals nothing usable about it)."""
    return "key-" + hashlib.sha256(b"statekeeper.codec.key-id\x00" + key).hexdigest()[:16]


def key_from_env(var: str) -> bytes:
    """Read a base64-encoded 32-byte key from the environment variable ``var``.

    Standard and URL-safe base64 are both accepted. Raises `InvalidInputError` naming
    the variable (never its value) when it is unset, not base64, or the wrong length.
    """
    value = os.environ.get(var)
    if value is None or not value.strip():
        raise InvalidInputError(
            f"environment variable {var} is not set; put a base64-encoded {KEY_SIZE}-byte "
            "key in it (base64.b64encode(StateCodec.generate_key()).decode())"
        )
    text = value.strip().replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)  # padding is often dropped from env values
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInputError(
            f"environment variable {var} is not valid base64; it must hold a base64-encoded "
            f"{KEY_SIZE}-byte key"
        ) from None
    return _check_key(key, f"the key in environment variable {var}")


# -- the codec ---------------------------------------------------------------------------


class StateCodec:
    """Compress and/or encrypt text into a self-describing envelope, and back.

    Args:
        compress: compress with zstd before (optionally) encrypting.
        key: 32 random bytes for AES-256-GCM; None writes unencrypted blobs and reads
            only unencrypted ones.
        key_id: the name written into encrypted blobs so a reader can pick the key
            (letters, digits and ``. _ : @ -``); defaults to a short hash of the key.
        level: zstd compression level, 1 (fastest) to 22 (smallest).
        previous_keys: ``key id -> key`` accepted when decoding, for blobs written
            before a key rotation. Never used to encode.
        max_size: the largest decompressed size accepted, in bytes (a guard against
            decompression bombs in unauthenticated blobs).

    Each encrypted message gets a random 96-bit nonce; keep well under 2**32 messages
    per key (rotate keys long before that).

    Raises:
        InvalidInputError: a key of the wrong type or size, a bad key id or level.
        MissingExtraError: the ``crypto`` extra is needed but not installed.
    """

    __slots__ = ("_ciphers", "_compress", "_key_id", "_level", "_max_size")

    def __init__(
        self,
        *,
        compress: bool = False,
        key: bytes | None = None,
        key_id: str | None = None,
        level: int = 3,
        previous_keys: Mapping[str, bytes] | None = None,
        max_size: int = _DEFAULT_MAX_SIZE,
    ) -> None:
        if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 22:
            raise InvalidInputError(f"compression level must be an int from 1 to 22, got {level!r}")
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise InvalidInputError(f"max_size must be a positive int, got {max_size!r}")
        if key is None and (key_id is not None or previous_keys):
            # A reader holding only old keys would have to accept plain input: refuse.
            raise InvalidInputError(
                "key_id and previous_keys need a current key; pass key= as well"
            )
        self._compress = bool(compress)
        self._level = level
        self._max_size = max_size
        self._key_id: str | None = None
        self._ciphers: dict[str, AESGCM] = {}
        if key is not None:
            raw = _check_key(key, "key")
            self._key_id = _fingerprint(raw) if key_id is None else validate_id(key_id, "key id")
            self._ciphers[self._key_id] = _aesgcm(raw)
        for old_id, old_key in (previous_keys or {}).items():
            validate_id(old_id, "key id in previous_keys")
            if old_id in self._ciphers:
                raise InvalidInputError(
                    f"key id {old_id!r} is both the current key's and a previous key's; "
                    "give each key its own id"
                )
            self._ciphers[old_id] = _aesgcm(_check_key(old_key, f"previous key {old_id!r}"))
        if self._compress:
            _zstd()  # fail at construction, not at the first checkpoint

    @staticmethod
    def generate_key() -> bytes:
        """A new random 32-byte key (store it base64-encoded, e.g. for `key_from_env`)."""
        return os.urandom(KEY_SIZE)

    @property
    def compress(self) -> bool:
        """Whether `encode` compresses."""
        return self._compress

    @property
    def encrypted(self) -> bool:
        """Whether `encode` encrypts (and `decode` refuses unencrypted input)."""
        return self._key_id is not None

    @property
    def key_id(self) -> str | None:
        """The key id written into encrypted blobs (never the key)."""
        return self._key_id

    def __repr__(self) -> str:
        return (
            f"StateCodec(compress={self._compress}, encrypted={self.encrypted}, "
            f"key_id={self._key_id!r}, level={self._level})"
        )

    # -- encode --------------------------------------------------------------------------

    def encode(self, text: str, *, associated_data: bytes = b"") -> bytes:
        """Text to bytes: plain UTF-8 when the codec does nothing, else an envelope.

        ``associated_data`` (only with a key) binds the blob to a context that is not
        stored in it, e.g. ``b"tenant/run id"``: `decode` must be given the same bytes,
        so a blob copied to another record fails to decode.
        """
        if not isinstance(text, str):
            raise InvalidInputError(f"StateCodec.encode takes str, got {type(text).__name__}")
        self._check_associated(associated_data)
        try:
            body = text.encode()
        except UnicodeEncodeError as exc:
            raise InvalidPayloadError(
                f"text contains a lone surrogate ({exc.reason}); it is not valid UTF-8"
            ) from None
        flags = 0
        if self._compress:
            compressor = _zstd().ZstdCompressor(
                level=self._level, write_checksum=True, write_content_size=True
            )
            body = compressor.compress(body)
            flags |= _FLAG_COMPRESSED
        if self._key_id is None:
            if not flags:
                return body
            return ENVELOPE_MAGIC + bytes((ENVELOPE_VERSION, flags)) + body
        flags |= _FLAG_ENCRYPTED
        key_id = self._key_id.encode("ascii")
        nonce = os.urandom(_NONCE_SIZE)
        header = ENVELOPE_MAGIC + bytes((ENVELOPE_VERSION, flags, len(key_id))) + key_id + nonce
        sealed = self._ciphers[self._key_id].encrypt(nonce, body, header + associated_data)
        return header + sealed

    # -- decode --------------------------------------------------------------------------

    def decode(self, blob: bytes, *, associated_data: bytes = b"") -> str:
        """Bytes written by `encode` (or plain UTF-8 text, only without a key) to text.

        Raises:
            StateTamperedError: the blob was changed or truncated, or is unencrypted
                while this codec has a key.
            WrongKeyError: the blob is encrypted under a key this codec does not have.
            SchemaVersionError: the envelope was written by a newer statekeeper.
            PayloadTooLargeError: it decompresses to more than ``max_size`` bytes.
            MissingExtraError: the blob needs the ``crypto`` extra.
        """
        if not isinstance(blob, bytes | bytearray | memoryview):
            raise InvalidInputError(f"StateCodec.decode takes bytes, got {type(blob).__name__}")
        self._check_associated(associated_data)
        data = bytes(blob)
        if not data.startswith(ENVELOPE_MAGIC):
            if self._key_id is not None:
                raise _stripped()
            return _utf8(data)
        if len(data) < _PREFIX_SIZE:
            raise StateTamperedError(
                f"encoded state is truncated: {len(data)} bytes, shorter than the envelope "
                "header; restore it from a backup or an earlier checkpoint"
            )
        version, flags = data[4], data[5]
        if version > ENVELOPE_VERSION:
            raise SchemaVersionError(
                f"encoded state uses envelope version {version}, newer than this statekeeper "
                f"(reads up to version {ENVELOPE_VERSION}); upgrade statekeeper"
            )
        if version < 1:
            raise StateTamperedError(
                f"encoded state has an invalid envelope version ({version}); it was changed "
                "or is damaged - restore it from a backup or an earlier checkpoint"
            )
        if flags & ~_KNOWN_FLAGS:
            raise StateTamperedError(
                f"encoded state has unknown flags 0x{flags:02x}; it was changed or is damaged "
                "- restore it from a backup or an earlier checkpoint"
            )
        if flags & _FLAG_ENCRYPTED:
            body = self._decrypt(data, associated_data)
        elif self._key_id is not None:
            raise _stripped()
        else:
            body = data[_PREFIX_SIZE:]
        if flags & _FLAG_COMPRESSED:
            body = self._decompress(body)
        return _utf8(body)

    def _decrypt(self, data: bytes, associated_data: bytes) -> bytes:
        end = _PREFIX_SIZE + 1
        if len(data) < end:
            raise _truncated()
        size = data[_PREFIX_SIZE]
        start, end = end, end + size
        if size == 0 or len(data) < end + _NONCE_SIZE + _TAG_SIZE:
            raise _truncated()
        try:
            key_id = validate_id(data[start:end].decode("ascii"), "key id")
        except (UnicodeDecodeError, InvalidInputError):
            raise StateTamperedError(
                "encoded state has an unreadable key id; it was changed or is damaged - "
                "restore it from a backup or an earlier checkpoint"
            ) from None
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            if not self._ciphers:
                raise WrongKeyError(
                    f"encoded state is encrypted (key id {key_id!r}) but this codec has no "
                    "key; decode it with StateCodec(key=...) holding that key"
                )
            known = ", ".join(repr(k) for k in self._ciphers)
            raise WrongKeyError(
                f"encoded state is encrypted under key id {key_id!r}, which this codec does "
                f"not have (it has {known}); pass that key, or add it to previous_keys "
                "after a key rotation"
            )
        nonce_end = end + _NONCE_SIZE
        header, nonce = data[:nonce_end], data[end:nonce_end]
        from cryptography.exceptions import InvalidTag

        try:
            result: bytes = cipher.decrypt(nonce, data[nonce_end:], header + associated_data)
        except InvalidTag:
            raise StateTamperedError(
                f"encoded state failed authentication (key id {key_id!r}): it was changed or "
                "truncated, was encrypted with a different key under the same key id, or was "
                "bound to other associated data; nothing of it was used - restore it from a "
                "backup or an earlier checkpoint"
            ) from None
        return result

    def _decompress(self, body: bytes) -> bytes:
        zstandard = _zstd()
        try:
            size = zstandard.frame_content_size(body)
        except zstandard.ZstdError:
            raise _corrupt("its compressed body has no valid zstd frame header") from None
        if size < 0:
            raise _corrupt("its compressed body does not record its size")
        if size > self._max_size:
            raise PayloadTooLargeError(
                f"encoded state decompresses to {size} bytes; the limit is {self._max_size} "
                "(raise StateCodec(max_size=...) if this state is expected to be that large)"
            )
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        try:
            out: bytes = decompressor.decompress(body)
        except zstandard.ZstdError as exc:
            raise _corrupt(f"its compressed body does not decompress ({exc})") from None
        if not decompressor.eof or decompressor.unused_data or len(out) != size:
            raise _corrupt("its compressed body is truncated or has trailing bytes")
        return out

    def _check_associated(self, associated_data: bytes) -> None:
        if not isinstance(associated_data, bytes):
            raise InvalidInputError(
                f"associated_data must be bytes, got {type(associated_data).__name__}"
            )
        if associated_data and not self._ciphers:
            raise InvalidInputError(
                "associated_data is only checked for encrypted state; give the codec a key"
            )


def _utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise _corrupt("it is neither a statekeeper envelope nor UTF-8 text") from None


def _corrupt(problem: str) -> StateTamperedError:
    return StateTamperedError(
        f"encoded state is damaged: {problem}; restore it from a backup or an earlier checkpoint"
    )


def _truncated() -> StateTamperedError:
    return StateTamperedError(
        "encoded state is truncated (its envelope ends early); restore it from a backup "
        "or an earlier checkpoint"
    )


def _stripped() -> StateTamperedError:
    return StateTamperedError(
        "encoded state is not encrypted, but this codec has a key and so refuses it: "
        "accepting plain input would let anyone who can write the store replace an "
        "encrypted state with one of their own (strip the encryption). To encrypt "
        "existing plain states, read them with StateCodec() (no key) and write them "
        "back with the keyed codec"
    )
