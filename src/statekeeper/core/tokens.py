"""Pluggable token counting. Pure: no I/O, no downloads.

A `TokenCounter` counts the tokens of a text and of a whole `Message`. The built-in
`EstimateCounter` needs no tokenizer; `CallableCounter` wraps any real tokenizer, e.g.
``CallableCounter(lambda s: len(enc.encode(s)))`` with a tiktoken encoding.

Both count a message the same way: a fixed overhead per message (role and framing), the
message's ``name``, then each content block:

* text: its text;
* tool call: the tool name plus the JSON arguments text;
* tool result: its content;
* image: a fixed cost (``image_tokens``, 85 by default: OpenAI's price of a low-detail
  image; high-detail images cost more, so raise it if you send large images);
* file: its name only (inline data is not counted: providers price files in their own way);
* any other block: the length of its compact JSON text.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from statekeeper.core.messages import (
    FileBlock,
    ImageBlock,
    Message,
    OtherBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from statekeeper.errors import InvalidInputError, InvalidPayloadError

__all__ = [
    "DEFAULT_COUNTER",
    "CallableCounter",
    "EstimateCounter",
    "TokenCounter",
    "counted",
    "message_tokens",
]


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens. Implementations must be pure and never return a negative count."""

    def count_text(self, text: str) -> int:
        """The number of tokens in ``text``."""
        ...

    def count_message(self, message: Message) -> int:
        """The number of tokens ``message`` costs in a model request, overhead included."""
        ...


# Scripts whose tokenizers spend about one token per character (kana, CJK ideographs,
# hangul syllables): each such character is a piece of its own.
_DENSE = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
# A piece is a dense-script character, a run of other word characters, or a run of
# punctuation/symbols. Whitespace separates pieces and is never a piece.
_PIECE = re.compile(rf"[{_DENSE}]|(?:(?![{_DENSE}])\w)+|[^\w\s]+")
_HAS_DENSE = re.compile(rf"[{_DENSE}]")
_SIMPLE_PIECES = re.compile(r"\w+|[^\w\s]+")


def _ascii_tables() -> tuple[bytes, bytes]:
    words, marks = bytearray(b" " * 256), bytearray(b" " * 256)
    for code in range(128):
        char = chr(code)
        if re.fullmatch(r"\w", char):
            words[code] = ord("w")
        elif not char.isspace():  # the same whitespace as the pattern's \s (\x1c-\x1f too)
            marks[code] = ord("p")
    return bytes(words), bytes(marks)


_WORDS, _MARKS = _ascii_tables()


def _ascii_pieces(data: bytes) -> int:
    """`_SIMPLE_PIECES`'s count for ASCII text: each run of ``w`` or of ``p`` is a piece.

    Two byte translations and two substring counts, all in C: about a tenth of the regex.
    """
    return (b" " + data.translate(_WORDS)).count(b" w") + (b" " + data.translate(_MARKS)).count(
        b" p"
    )


def _count_message(
    message: Message, count_text: Callable[[str], int], per_message: int, image_tokens: int
) -> int:
    total = per_message
    if message.name:
        total += count_text(message.name)
    if isinstance(message.content, str):
        return total + count_text(message.content)
    for block in message.content:
        if isinstance(block, TextBlock):
            total += count_text(block.text)
        elif isinstance(block, ToolCallBlock):
            total += count_text(block.name) + count_text(block.arguments)
        elif isinstance(block, ToolResultBlock):
            total += count_text(block.content)
        elif isinstance(block, ImageBlock):
            total += image_tokens
        elif isinstance(block, FileBlock):
            total += count_text(block.name or "")
        elif isinstance(block, OtherBlock):
            compact = json.dumps(
                block.as_dict(), ensure_ascii=False, sort_keys=True, separators=(",", ":")
            )
            total += count_text(compact)
    return total


def _check_costs(per_message: int, image_tokens: int) -> None:
    if per_message < 0 or image_tokens < 0:
        raise InvalidInputError(
            f"per_message ({per_message}) and image_tokens ({image_tokens}) must be >= 0"
        )


@dataclass(frozen=True)
class EstimateCounter:
    """A tokenizer-free estimate, close to (and usually a little above) BPE tokenizers.

    ``count_text`` is the larger of two lower bounds:

    * ``ceil(utf8_bytes / bytes_per_token)``: BPE vocabularies average about 4 bytes of
      English per token, and fewer for other scripts (whose characters take more bytes);
    * the number of *pieces*: words, punctuation runs, and single kana / CJK / hangul
      characters. BPE tokenizers almost never merge across a space, so every word costs
      at least one token, which the byte rule underestimates for short words and numbers.

    Both bounds only grow when characters are added anywhere in a text, so the estimate is
    monotonic: more text never gives fewer tokens.
    """

    bytes_per_token: float = 4.0
    per_message: int = 4
    image_tokens: int = 85

    def __post_init__(self) -> None:
        if not self.bytes_per_token > 0:
            raise InvalidInputError(f"bytes_per_token must be > 0, got {self.bytes_per_token}")
        _check_costs(self.per_message, self.image_tokens)

    def count_text(self, text: str) -> int:
        """Estimated tokens in ``text`` (0 for the empty string)."""
        if not text:
            return 0
        if text.isascii():
            data = text.encode("ascii")
            return max(math.ceil(len(data) / self.bytes_per_token), _ascii_pieces(data))
        try:
            by_bytes = math.ceil(len(text.encode("utf-8")) / self.bytes_per_token)
        except UnicodeEncodeError as exc:  # only non-ASCII text gets here: no cost to others
            raise InvalidPayloadError(
                f"text contains a lone surrogate ({exc.object[exc.start : exc.end]!r} at "
                f"{exc.start}); it is not valid UTF-8: decode your input with "
                "errors='replace', or drop the unpaired half"
            ) from None
        if _HAS_DENSE.search(text) is None:
            # Without kana / CJK / hangul the lookahead of _PIECE never applies: the same
            # count from a pattern about twice as fast (this runs on every append).
            pieces = _SIMPLE_PIECES.subn("", text)[1]
        else:
            pieces = sum(1 for _ in _PIECE.finditer(text))
        return max(by_bytes, pieces)

    def count_message(self, message: Message) -> int:
        """Estimated tokens of ``message``: ``per_message`` plus its name and blocks."""
        return _count_message(message, self.count_text, self.per_message, self.image_tokens)


@dataclass(frozen=True)
class CallableCounter:
    """A counter around any ``str -> int`` tokenizer function.

    Example: ``CallableCounter(lambda s: len(encoding.encode(s)))``. Messages are counted
    as described in the module docstring, with ``fn`` for every text.
    """

    fn: Callable[[str], int]
    per_message: int = 4
    image_tokens: int = 85

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise InvalidInputError(f"fn must be callable, got {type(self.fn).__name__}")
        _check_costs(self.per_message, self.image_tokens)

    def count_text(self, text: str) -> int:
        """``fn(text)``, checked to be a non-negative integer."""
        if not text:
            return 0
        count = self.fn(text)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidInputError(
                f"the token counting function returned {count!r}; it must return an int >= 0"
            )
        return count

    def count_message(self, message: Message) -> int:
        """Tokens of ``message``: ``per_message`` plus its name and blocks."""
        return _count_message(message, self.count_text, self.per_message, self.image_tokens)


DEFAULT_COUNTER: TokenCounter = EstimateCounter()
"""The counter used when none is given: an `EstimateCounter` with default settings."""


def message_tokens(message: Message, counter: TokenCounter | None = None) -> int:
    """``message.tokens`` when it was measured, else the count from ``counter``.

    ``counter`` defaults to `DEFAULT_COUNTER`.
    """
    if message.tokens is not None:
        return message.tokens
    return (DEFAULT_COUNTER if counter is None else counter).count_message(message)


def counted(message: Message, counter: TokenCounter | None = None) -> Message:
    """``message`` with its token count filled in (itself if it already has one)."""
    if message.tokens is not None:
        return message
    # The count is an int we computed: no need to validate the whole message again.
    return message.model_copy(update={"tokens": message_tokens(message, counter)})
