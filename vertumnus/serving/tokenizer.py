"""Byte-level tokenizer and chat template shipped with the project (no downloads).

Vocabulary (``model.vocab_size`` ≥ 262 ids)::

    0 .. 255     one id per UTF-8 byte
    256 <|bos|>  prepended to text prompts (completions and chat)
    257 <|eos|>  end of sequence: generation stops on it unless ``ignore_eos``
    258 <|system|>  259 <|user|>  260 <|assistant|>   role markers of the chat template
    261 <|end|>  end of a chat turn: chat generation stops on it
    262 ..       reserved; they decode to nothing (like skipped special tokens)

Chat template (the whole conversation, then the generation prompt)::

    <|bos|> ( <|role|> content-bytes <|end|> )*  <|assistant|>

Token-id prompts are used as given (no BOS). Decoding is incremental (:class:`TextStream`): bytes are buffered
until they form complete UTF-8 characters, invalid sequences become U+FFFD, and stop strings are matched on the
decoded text while holding back the tail that could still begin a stop string.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

BOS, EOS, SYSTEM, USER, ASSISTANT, END = 256, 257, 258, 259, 260, 261
NUM_BASE_IDS = 262
ROLE_IDS = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "assistant": ASSISTANT}


@dataclass(slots=True, frozen=True)
class ChatTurn:
    """One message of a conversation, already reduced to plain text."""

    role: str
    content: str


class Tokenizer(Protocol):
    """What the front end needs from a tokenizer (byte-level here, or :mod:`vertumnus.serving.hf_tokenizer`)."""

    vocab_size: int
    eos_ids: frozenset[int]  # ids that end a completion
    chat_end_ids: frozenset[int]  # ids that end an assistant turn

    def encode(self, text: str, add_bos: bool = True) -> list[int]: ...

    def apply_chat_template(self, turns: Sequence[ChatTurn]) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def check_ids(self, ids: Sequence[int]) -> None: ...


def make_tokenizer(path: str | None, vocab_size: int) -> Tokenizer:
    """The server's tokenizer: a Hugging Face tokenizer directory when ``path`` is set (real models), else the
    byte-level tokenizer of the tiny reference model."""
    if path:
        from vertumnus.serving.hf_tokenizer import HFTokenizer

        return HFTokenizer(path)
    return ByteTokenizer(vocab_size)


class ByteTokenizer:
    """UTF-8 bytes as token ids, plus the special ids in the module docstring."""

    __slots__ = ("_byte_table", "vocab_size")
    eos_ids = frozenset({EOS})
    chat_end_ids = frozenset({EOS, END})

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < NUM_BASE_IDS:
            raise ValueError(
                f"model.vocab_size={vocab_size} is too small for the byte tokenizer (needs ≥ {NUM_BASE_IDS})"
            )
        self.vocab_size = vocab_size
        # id -> bytes for every id; specials and reserved ids map to b"" (skipped on decode).
        self._byte_table = [bytes([i]) for i in range(256)] + [b""] * (vocab_size - 256)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of ``text`` (UTF-8 bytes), optionally after ``<|bos|>``."""
        ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).tolist()
        return [BOS, *ids] if add_bos else ids

    def apply_chat_template(self, turns: Sequence[ChatTurn]) -> list[int]:
        """Token ids of a conversation ending with the assistant's generation prompt."""
        out = [BOS]
        for turn in turns:
            role = ROLE_IDS.get(turn.role)
            if role is None:
                raise ValueError(f"unsupported chat role {turn.role!r}; use system, developer, user or assistant")
            out.append(role)
            out.extend(self.encode(turn.content, add_bos=False))
            out.append(END)
        out.append(ASSISTANT)
        return out

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """Raw bytes of ``ids``; special and reserved ids contribute nothing."""
        table = self._byte_table
        return b"".join(table[i] for i in ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (invalid UTF-8 becomes U+FFFD)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def check_ids(self, ids: Sequence[int]) -> None:
        """Raise ValueError when a prompt id is outside the vocabulary."""
        if not ids:
            return
        arr = np.asarray(ids, dtype=np.int64)
        if int(arr.min()) < 0 or int(arr.max()) >= self.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")


class TextStream:
    """Incremental detokenizer with stop-string detection for one generation.

    ``feed(ids)`` returns the text that may be emitted now. Invariant: the emitted text never contains a stop
    string nor anything after the first one, and at most ``max(len(stop)) - 1`` decoded characters are held back
    (they could be the beginning of a stop string); ``flush()`` releases them when generation ends otherwise.
    Byte-level tokenizers decode incrementally (bytes → UTF-8 decoder); others re-decode the generated ids and
    take the new suffix, holding back a trailing U+FFFD (a character whose bytes are not all generated yet).
    """

    __slots__ = ("_decoder", "_done", "_held", "_hold", "_ids", "_stops", "_tok", "stopped", "text")

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        self._tok = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._held = ""
        self._ids: list[int] = []
        self._done = ""  # generic path: decoded text already passed on (to _held or out)
        self.text = ""  # everything emitted so far
        self.stopped = False  # a stop string was found

    def _new_text(self, ids: Sequence[int], final: bool) -> str:
        if isinstance(self._tok, ByteTokenizer):
            return self._decoder.decode(self._tok.decode_bytes(ids), final=final)
        self._ids.extend(ids)
        full = self._tok.decode(self._ids)
        if not final and full.endswith("\ufffd"):
            full = full.rstrip("\ufffd")
        new = full[len(self._done) :] if full.startswith(self._done) else ""
        self._done += new
        return new

    def feed(self, ids: Sequence[int]) -> str:
        """Decode ``ids``; return newly emittable text (empty once a stop string was found)."""
        if self.stopped:
            return ""
        pending = self._held + self._new_text(ids, final=False)
        if self._stops:
            cut = min((i for i in (pending.find(s) for s in self._stops) if i >= 0), default=-1)
            if cut >= 0:
                self.stopped = True
                self._held = ""
                return self._emit(pending[:cut])
        keep = min(self._hold, len(pending))
        self._held = pending[len(pending) - keep :] if keep else ""
        return self._emit(pending[: len(pending) - keep])

    def flush(self) -> str:
        """End of generation: emit held-back text and any incomplete UTF-8 tail (as U+FFFD)."""
        if self.stopped:
            return ""
        rest = self._held + self._new_text((), final=True)
        self._held = ""
        return self._emit(rest)

    def _emit(self, s: str) -> str:
        self.text += s
        return s
