"""`StateCodec`: compression, authenticated encryption, and the RunState helpers
(`statekeeper.runs.sealing`)."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest

from statekeeper.codec import (
    ENVELOPE_MAGIC,
    ENVELOPE_VERSION,
    StateCodec,
    StateTamperedError,
    WrongKeyError,
    key_from_env,
)
from statekeeper.core.messages import Message
from statekeeper.errors import (
    InvalidIdError,
    InvalidInputError,
    InvalidPayloadError,
    MissingExtraError,
    PayloadTooLargeError,
    SchemaVersionError,
    StoreCorruptError,
)
from statekeeper.runs.sealing import dump_state, load_state
from statekeeper.runs.state import CURRENT_SCHEMA_VERSION, RunState

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "run_state"
FIXTURE_KEY = bytes(range(32))  # test-only key of the frozen envelope fixtures
KEY = b"k" * 16 + b"\x00\x01\x02\x03" * 4
OTHER_KEY = b"\xa5" * 32


def fixture_text(rel: str) -> str:
    return (FIXTURES / rel).read_text(encoding="utf-8")


def big_state() -> tuple[RunState, list[Message]]:
    """The v2 features state with 300 messages of ordinary conversation."""
    state = RunState.from_json(fixture_text("v2/features.json"))
    items = [
        Message.user(f"Question {i}: what is the status of ticket INC-{i}?")
        if i % 2 == 0
        else Message.assistant(f"Ticket INC-{i - 1} is open and assigned to the on-call team.")
        for i in range(300)
    ]
    return state, items


def secret_forms(key: bytes) -> list[str]:
    return [
        key.hex(),
        base64.b64encode(key).decode(),
        base64.urlsafe_b64encode(key).decode(),
        repr(key),
        key.decode("latin-1"),
    ]


CODECS = {
    "plain": lambda: StateCodec(),
    "compressed": lambda: StateCodec(compress=True),
    "encrypted": lambda: StateCodec(key=KEY),
    "compressed+encrypted": lambda: StateCodec(compress=True, key=KEY, level=9),
}
TEXTS = [
    "",
    "{}",
    '{"a": 1}',
    "naïve café ✓ 🦀 \u0000 \u2028",
    fixture_text("v2/features.json"),
]


# -- round trips ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CODECS))
@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_round_trip(name: str, text: str) -> None:
    codec = CODECS[name]()
    blob = codec.encode(text)
    assert isinstance(blob, bytes)
    assert codec.decode(blob) == text
    if codec.encrypted:  # what was done is read from the blob, not from the reader's options
        assert StateCodec(compress=not codec.compress, key=KEY).decode(blob) == text


@pytest.mark.parametrize("name", list(CODECS))
def test_the_envelope_says_what_was_done(name: str) -> None:
    codec = CODECS[name]()
    text = fixture_text("v2/minimal.json")
    blob = codec.encode(text)
    if name == "plain":
        assert blob == text.encode()  # nothing to do: no envelope
        return
    assert blob.startswith(ENVELOPE_MAGIC)
    assert blob[4] == ENVELOPE_VERSION
    assert bool(blob[5] & 0x01) == codec.compress
    assert bool(blob[5] & 0x02) == codec.encrypted


def test_any_codec_without_a_key_reads_plain_and_compressed_blobs() -> None:
    text = fixture_text("v2/features.json")
    for writer in (StateCodec(), StateCodec(compress=True)):
        for reader in (StateCodec(), StateCodec(compress=True)):
            assert reader.decode(writer.encode(text)) == text


def test_encryption_hides_the_text_and_uses_a_fresh_nonce() -> None:
    codec = StateCodec(key=KEY)
    text = fixture_text("v2/features.json")
    first, second = codec.encode(text), codec.encode(text)
    assert first != second
    assert codec.decode(first) == codec.decode(second) == text
    for secret in ("ops-assistant", "tenant-a", "gpt-4o", "run_features_v2"):
        assert secret.encode() not in first


def test_compression_shrinks_a_large_state() -> None:
    state, items = big_state()
    plain = dump_state(state, items)
    compressed = dump_state(state, items, StateCodec(compress=True))
    both = dump_state(state, items, StateCodec(compress=True, key=KEY))
    assert len(compressed) * 5 < len(plain)
    assert len(both) < len(compressed) + 64  # header, nonce and tag only
    assert load_state(compressed) == load_state(plain)


def test_higher_levels_do_not_grow_the_output() -> None:
    state, items = big_state()
    fast = dump_state(state, items, StateCodec(compress=True, level=1))
    small = dump_state(state, items, StateCodec(compress=True, level=19))
    assert len(small) <= len(fast)


# -- tampering and truncation -----------------------------------------------------------


def regions(blob: bytes, key_id: str) -> dict[str, range]:
    """Byte positions of each part of an encrypted envelope."""
    nonce_at = 7 + len(key_id)
    body_at = nonce_at + 12
    return {
        "magic": range(4),
        "version": range(4, 5),
        "flags": range(5, 6),
        "key id length": range(6, 7),
        "key id": range(7, nonce_at),
        "nonce": range(nonce_at, body_at),
        "ciphertext": range(body_at, len(blob) - 16),
        "tag": range(len(blob) - 16, len(blob)),
    }


def flipped(blob: bytes, position: int, mask: int) -> bytes:
    data = bytearray(blob)
    data[position] ^= mask
    return bytes(data)


@pytest.mark.parametrize("compress", [False, True])
def test_every_single_bit_flip_is_detected(compress: bool) -> None:
    codec = StateCodec(compress=compress, key=KEY, key_id="key-1")
    blob = codec.encode('{"run_id": "run_1", "status": "paused"}')
    for position in range(len(blob)):
        with pytest.raises(StateTamperedError):
            codec.decode(flipped(blob, position, 0x01))


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
@pytest.mark.parametrize(
    "region",
    ["magic", "flags", "key id length", "key id", "nonce", "ciphertext", "tag"],
)
def test_a_changed_byte_in_any_region_is_detected(region: str, mask: int) -> None:
    codec = StateCodec(compress=True, key=KEY, key_id="key-1")
    blob = codec.encode(fixture_text("v2/features.json"))
    positions = regions(blob, "key-1")[region]
    assert len(positions) > 0
    sample = sorted({positions[0], positions[len(positions) // 2], positions[-1]})
    for position in sample:
        with pytest.raises(StateTamperedError):
            codec.decode(flipped(blob, position, mask))


def test_a_changed_version_byte_is_refused() -> None:
    """Lower: tampered. Higher: reads as a newer format, which is refused too."""
    codec = StateCodec(key=KEY)
    blob = codec.encode("{}")
    with pytest.raises(StateTamperedError, match="invalid envelope version"):
        codec.decode(flipped(blob, 4, 0x01))  # 1 -> 0
    with pytest.raises(SchemaVersionError):
        codec.decode(flipped(blob, 4, 0x80))  # 1 -> 129


def test_the_whole_header_is_the_associated_data() -> None:
    """Pins the format: AES-GCM over the body, with every header byte authenticated."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    blob = StateCodec(key=KEY, key_id="key-1").encode("hello")
    header_end = 7 + len("key-1") + 12
    header, nonce = blob[:header_end], blob[header_end - 12 : header_end]
    assert AESGCM(KEY).decrypt(nonce, blob[header_end:], header) == b"hello"
    with pytest.raises(InvalidTag):
        AESGCM(KEY).decrypt(nonce, blob[header_end:], None)


def test_tampered_is_a_store_corrupt_error() -> None:
    assert issubclass(StateTamperedError, StoreCorruptError)
    assert issubclass(WrongKeyError, StateTamperedError)


@pytest.mark.parametrize("compress", [False, True])
def test_every_truncation_of_an_encrypted_blob_is_detected(compress: bool) -> None:
    codec = StateCodec(compress=compress, key=KEY)
    blob = codec.encode(fixture_text("v2/minimal.json"))
    for length in range(len(blob)):
        with pytest.raises(StateTamperedError):
            codec.decode(blob[:length])


def test_appended_bytes_are_detected() -> None:
    codec = StateCodec(compress=True, key=KEY)
    blob = codec.encode("{}")
    with pytest.raises(StateTamperedError, match="failed authentication"):
        codec.decode(blob + b"\x00")


def test_damaged_compressed_blobs_without_a_key_are_detected() -> None:
    """No authentication here, but the zstd checksum and size checks still catch damage."""
    codec = StateCodec(compress=True)
    blob = codec.encode(fixture_text("v2/features.json"))
    for length in range(1, len(blob), 7):
        with pytest.raises(StateTamperedError):
            codec.decode(blob[:length])
    with pytest.raises(StateTamperedError, match="trailing"):
        codec.decode(blob + b"junk")
    for position in range(6, len(blob), 97):
        with pytest.raises(StateTamperedError):
            codec.decode(flipped(blob, position, 0x10))


def test_unknown_flags_are_refused() -> None:
    blob = StateCodec(compress=True).encode("{}")
    with pytest.raises(StateTamperedError, match="unknown flags 0x41"):
        StateCodec().decode(blob[:5] + b"\x41" + blob[6:])


def test_bytes_that_are_neither_envelope_nor_text_are_refused() -> None:
    with pytest.raises(StateTamperedError, match="neither a statekeeper envelope nor UTF-8"):
        StateCodec().decode(b"\xff\xfe\x00garbage")


# -- keys -------------------------------------------------------------------------------


def test_wrong_key_id_is_named() -> None:
    blob = StateCodec(key=KEY, key_id="key-2024").encode("{}")
    with pytest.raises(WrongKeyError) as info:
        StateCodec(key=OTHER_KEY, key_id="key-2025").decode(blob)
    assert "'key-2024'" in str(info.value)
    assert "'key-2025'" in str(info.value)


def test_wrong_key_with_default_key_ids() -> None:
    blob = StateCodec(key=KEY).encode("{}")
    with pytest.raises(WrongKeyError):
        StateCodec(key=OTHER_KEY).decode(blob)


def test_wrong_key_under_the_same_key_id_fails_authentication() -> None:
    blob = StateCodec(key=KEY, key_id="shared").encode("{}")
    with pytest.raises(StateTamperedError, match="failed authentication"):
        StateCodec(key=OTHER_KEY, key_id="shared").decode(blob)


def test_encrypted_blob_without_a_key() -> None:
    blob = StateCodec(key=KEY, key_id="key-1").encode("{}")
    with pytest.raises(WrongKeyError, match=r"'key-1'.*has no key"):
        StateCodec().decode(blob)
    with pytest.raises(WrongKeyError):
        load_state(blob)


def test_key_rotation_reads_old_blobs_and_writes_new_ones() -> None:
    old = StateCodec(key=KEY, key_id="key-old").encode("old state")
    codec = StateCodec(key=OTHER_KEY, key_id="key-new", previous_keys={"key-old": KEY})
    assert codec.decode(old) == "old state"
    new = codec.encode("new state")
    assert b"key-new" in new
    with pytest.raises(WrongKeyError):
        StateCodec(key=KEY, key_id="key-old").decode(new)


def test_default_key_id_is_stable_and_depends_on_the_key() -> None:
    first, again, other = StateCodec(key=KEY), StateCodec(key=KEY), StateCodec(key=OTHER_KEY)
    assert first.key_id == again.key_id
    assert first.key_id != other.key_id
    assert first.key_id is not None
    assert first.key_id.startswith("key-")
    for secret in secret_forms(KEY):
        assert secret not in first.key_id


@pytest.mark.parametrize("key", [b"", b"short", b"x" * 31, b"x" * 33, "k" * 32, 12345], ids=repr)
def test_bad_keys_are_refused(key: object) -> None:
    with pytest.raises(InvalidInputError, match="32") as info:
        StateCodec(key=key)  # type: ignore[arg-type]
    if isinstance(key, bytes) and key:
        for secret in secret_forms(key):
            assert secret not in str(info.value)


def test_bad_options_are_refused() -> None:
    with pytest.raises(InvalidIdError):
        StateCodec(key=KEY, key_id="../escape")
    with pytest.raises(InvalidInputError, match="need a current key"):
        StateCodec(key_id="lonely")
    with pytest.raises(InvalidInputError, match="need a current key"):
        StateCodec(previous_keys={"old": KEY})  # would have to accept plain input
    with pytest.raises(InvalidIdError, match="must not be empty"):
        StateCodec(key=KEY, key_id="")
    with pytest.raises(InvalidInputError, match="both the current key's and a previous"):
        StateCodec(key=KEY, key_id="k1", previous_keys={"k1": OTHER_KEY})
    for level in (0, 23, True, 2.5):
        with pytest.raises(InvalidInputError, match="level"):
            StateCodec(compress=True, level=level)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="max_size"):
        StateCodec(max_size=0)
    with pytest.raises(InvalidInputError, match="previous key"):
        StateCodec(key=KEY, previous_keys={"old": b"short"})


def test_generate_key() -> None:
    first, second = StateCodec.generate_key(), StateCodec.generate_key()
    assert isinstance(first, bytes)
    assert len(first) == 32
    assert first != second
    assert StateCodec(key=first).decode(StateCodec(key=first).encode("x")) == "x"


def test_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SK_TEST_KEY", base64.b64encode(KEY).decode())
    assert key_from_env("SK_TEST_KEY") == KEY
    monkeypatch.setenv(
        "SK_TEST_KEY", " " + base64.urlsafe_b64encode(OTHER_KEY).decode().rstrip("=") + "\n"
    )
    assert key_from_env("SK_TEST_KEY") == OTHER_KEY


def test_key_from_env_errors_name_the_variable_not_the_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SK_TEST_KEY", raising=False)
    with pytest.raises(InvalidInputError, match="SK_TEST_KEY is not set"):
        key_from_env("SK_TEST_KEY")
    bad_values = ["not base64 at all!!", base64.b64encode(b"too short").decode()]
    for value in bad_values:
        monkeypatch.setenv("SK_TEST_KEY", value)
        with pytest.raises(InvalidInputError, match="SK_TEST_KEY") as info:
            key_from_env("SK_TEST_KEY")
        assert value not in str(info.value)


# -- refusing unencrypted input ---------------------------------------------------------


@pytest.mark.parametrize("writer", [StateCodec(), StateCodec(compress=True)], ids=repr)
def test_a_keyed_codec_refuses_unencrypted_input(writer: StateCodec) -> None:
    blob = writer.encode(fixture_text("v2/minimal.json"))
    with pytest.raises(StateTamperedError) as info:
        StateCodec(key=KEY).decode(blob)
    message = str(info.value)
    assert "not encrypted" in message
    assert "strip the encryption" in message
    assert "StateCodec()" in message  # how to migrate plain states


def test_load_state_with_a_key_refuses_plain_text() -> None:
    with pytest.raises(StateTamperedError, match="not encrypted"):
        load_state(fixture_text("v2/minimal.json"), StateCodec(key=KEY))


# -- associated data --------------------------------------------------------------------


def test_associated_data_binds_a_blob_to_its_place() -> None:
    codec = StateCodec(key=KEY)
    blob = codec.encode("{}", associated_data=b"tenant-a/run_1")
    assert codec.decode(blob, associated_data=b"tenant-a/run_1") == "{}"
    for wrong in (b"tenant-b/run_1", b""):
        with pytest.raises(StateTamperedError, match="associated data"):
            codec.decode(blob, associated_data=wrong)


def test_associated_data_needs_a_key() -> None:
    with pytest.raises(InvalidInputError, match="give the codec a key"):
        StateCodec().encode("{}", associated_data=b"x")
    with pytest.raises(InvalidInputError, match="give the codec a key"):
        StateCodec(compress=True).decode(b"{}", associated_data=b"x")


# -- versions and limits ----------------------------------------------------------------


@pytest.mark.parametrize("codec", [StateCodec(), StateCodec(key=KEY)], ids=repr)
def test_newer_envelope_version(codec: StateCodec) -> None:
    newer = ENVELOPE_MAGIC + bytes((ENVELOPE_VERSION + 1, 0x03)) + b"\x00" * 40
    with pytest.raises(SchemaVersionError) as info:
        codec.decode(newer)
    message = str(info.value)
    assert f"version {ENVELOPE_VERSION + 1}" in message
    assert f"up to version {ENVELOPE_VERSION}" in message
    assert "upgrade statekeeper" in message


def test_decompression_size_limit() -> None:
    blob = StateCodec(compress=True).encode("x" * 100_000)
    with pytest.raises(PayloadTooLargeError, match="100000 bytes"):
        StateCodec(max_size=10_000).decode(blob)
    assert StateCodec(max_size=100_000).decode(blob) == "x" * 100_000


def test_wrong_argument_types() -> None:
    with pytest.raises(InvalidInputError, match="takes bytes"):
        StateCodec().decode("{}")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="takes str"):
        StateCodec().encode(b"{}")  # type: ignore[arg-type]
    with pytest.raises(InvalidPayloadError, match="surrogate"):
        StateCodec(key=KEY).encode("\ud800")
    assert StateCodec().decode(bytearray(b"{}")) == "{}"  # type: ignore[arg-type]


# -- never show a key -------------------------------------------------------------------


def test_the_key_never_appears_in_repr_str_or_errors() -> None:
    codec = StateCodec(compress=True, key=KEY, key_id="key-1", previous_keys={"old": OTHER_KEY})
    shown = [repr(codec), str(codec)]
    blob = codec.encode("{}")
    failures = [
        flipped(blob, len(blob) - 1, 0x01),
        blob[:10],
        b"{}",
        StateCodec(key=OTHER_KEY, key_id="other").encode("{}"),
    ]
    for bad in failures:
        with pytest.raises(StateTamperedError) as info:
            codec.decode(bad)
        shown += [str(info.value), repr(info.value)]
    with pytest.raises(StateTamperedError) as auth:
        StateCodec(key=OTHER_KEY, key_id="key-1").decode(blob)
    shown += [str(auth.value), repr(auth.value)]
    for text in shown:
        for key in (KEY, OTHER_KEY):
            for secret in secret_forms(key):
                assert secret not in text
    assert repr(codec) == "StateCodec(compress=True, encrypted=True, key_id='key-1', level=3)"
    assert not hasattr(codec, "__dict__")


# -- RunState helpers -------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CODECS))
def test_dump_and_load_state(name: str) -> None:
    codec = CODECS[name]()
    state, items = big_state()
    blob = dump_state(state, items, codec)
    loaded = load_state(blob, codec)
    assert loaded == state.model_copy(update={"items": [m.to_dict() for m in items]})
    assert loaded.messages() == items


def test_dump_state_without_items_keeps_the_states_own() -> None:
    state = RunState.from_json(fixture_text("v2/features.json"))
    assert load_state(dump_state(state)) == state
    assert dump_state(state) == state.to_json().encode()


def test_load_state_migrates_older_versions() -> None:
    for source in (fixture_text("v1/features.json"), fixture_text("v1/features.json").encode()):
        state = load_state(source)
        assert state.schema_version == CURRENT_SCHEMA_VERSION
        assert state.error is not None
        assert state.error.type == "Error"


def test_load_state_reports_a_bad_payload_after_decoding() -> None:
    codec = StateCodec(compress=True, key=KEY)
    with pytest.raises(InvalidPayloadError, match="not valid JSON"):
        load_state(codec.encode(fixture_text("negative/truncated.json")), codec)
    with pytest.raises(SchemaVersionError, match="999"):
        load_state(codec.encode(fixture_text("negative/newer_version.json")), codec)


def test_dump_state_refuses_nan() -> None:
    state = RunState.from_json(fixture_text("v2/minimal.json"))
    state.context = {"score": float("nan")}
    with pytest.raises(InvalidPayloadError, match="not plain JSON"):
        dump_state(state)


# -- frozen envelopes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("envelope/v1/features.zst", "v2/features.json"),
        ("envelope/v1/features.enc", "v2/features.json"),
        ("envelope/v1/minimal.enc", "v2/minimal.json"),
    ],
)
def test_frozen_envelopes_still_decode(name: str, source: str) -> None:
    blob = (FIXTURES / name).read_bytes()
    codec = StateCodec(key=FIXTURE_KEY, key_id="fixture-key-1") if name.endswith(".enc") else None
    text = (codec or StateCodec()).decode(blob)
    assert text == fixture_text(source)
    assert load_state(blob, codec) == RunState.from_json(fixture_text(source))


# -- optional dependencies --------------------------------------------------------------


def test_missing_zstandard(monkeypatch: pytest.MonkeyPatch) -> None:
    blob = StateCodec(compress=True).encode("{}")
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(MissingExtraError, match=r"statekeeper\[crypto\]") as info:
        StateCodec(compress=True)
    assert info.value.extra == "crypto"
    assert "state compression" in str(info.value)
    with pytest.raises(MissingExtraError, match="crypto"):
        StateCodec().decode(blob)
    assert StateCodec().decode(b"{}") == "{}"


def test_missing_cryptography(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    with pytest.raises(MissingExtraError) as info:
        StateCodec(key=KEY)
    assert str(info.value).startswith("state encryption requires the 'crypto' extra")
    assert isinstance(info.value, ImportError)


def test_the_core_install_imports_without_the_extra() -> None:
    script = (
        "import sys\n"
        "for name in ('zstandard', 'cryptography'):\n"
        "    sys.modules[name] = None\n"
        "from statekeeper.codec import StateCodec\n"
        "from statekeeper.runs.sealing import dump_state, load_state\n"
        "from statekeeper.runs.state import RunState\n"
        "state = RunState(tenant='t', session_id='s', agent='a')\n"
        "assert load_state(dump_state(state)) == state.model_copy(update={'items': []})\n"
        "assert StateCodec().decode(StateCodec().encode('x')) == 'x'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
