"""A Hugging Face tokenizer for real models (``serving.tokenizer``: a local directory with ``tokenizer.json`` /
``tokenizer_config.json``, e.g. the model's own). Loaded with ``local_files_only``: nothing is downloaded.

Completions end on the tokenizer's EOS (and the ids of ``generation_config.json``'s ``eos_token_id`` when the
directory has one); chat uses the tokenizer's own chat template with the generation prompt appended.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vertumnus.serving.tokenizer import ChatTurn


class HFTokenizer:
    """Adapter of ``transformers.AutoTokenizer`` to the server's :class:`~vertumnus.serving.tokenizer.Tokenizer`."""

    def __init__(self, path: str) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ValueError("serving.tokenizer needs the 'transformers' package (pip install transformers)") from None
        p = Path(path)
        if not p.is_dir():
            raise ValueError(f"serving.tokenizer: {path} is not a directory")
        self._tok: Any = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        self.vocab_size = len(self._tok)
        ends = {self._tok.eos_token_id} if self._tok.eos_token_id is not None else set()
        gen = p / "generation_config.json"
        if gen.exists():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            ends.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.eos_ids = frozenset(int(e) for e in ends)
        self.chat_end_ids = self.eos_ids

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_bos))

    def apply_chat_template(self, turns: Sequence[ChatTurn]) -> list[int]:
        msgs = [{"role": "system" if t.role == "developer" else t.role, "content": t.content} for t in turns]
        out = self._tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        return [int(i) for i in (out["input_ids"] if hasattr(out, "keys") else out)]  # BatchEncoding or list

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def check_ids(self, ids: Sequence[int]) -> None:
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
