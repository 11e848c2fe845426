"""The byte-level tokenizer (:mod:`vertumnus.serving.tokenizer`) as a Hugging Face tokenizer directory.

Third-party clients (``vllm bench serve``, ``transformers``, ``lm-eval``) need a tokenizer they can load to count
and build prompts. ``vertumnus tokenizer export`` writes one for a config's tiny model, and the repository ships
the default one in ``configs/tokenizers/vertumnus-tiny/``. It encodes exactly as the server does::

    text             -> <|bos|> + one id per UTF-8 byte        (ids 0..255 in byte order, BOS = 256)
    chat messages    -> <|bos|> ( <|role|> bytes <|end|> )* <|assistant|>     (chat_template)
    ids 262..V-1     -> reserved special tokens, decoded to nothing with skip_special_tokens

Built from a byte-level BPE with no merges: the ByteLevel pre-tokenizer maps each byte to one printable
character (the GPT-2 byte alphabet) and the vocabulary maps that character to the byte's value. One difference
from the server: text that spells a special token (``"<|eos|>"``) is that token for a Hugging Face tokenizer and
seven bytes for the server.
"""

from __future__ import annotations

import json
from pathlib import Path

from vertumnus.serving.tokenizer import ASSISTANT, BOS, END, EOS, NUM_BASE_IDS, SYSTEM, USER

SPECIAL_NAMES = {
    BOS: "<|bos|>",
    EOS: "<|eos|>",
    SYSTEM: "<|system|>",
    USER: "<|user|>",
    ASSISTANT: "<|assistant|>",
    END: "<|end|>",
}
# Jinja chat template of the server's ByteTokenizer.apply_chat_template (developer = system; the generation
# prompt is always appended, as the server does).
CHAT_TEMPLATE = (
    "{{ '<|bos|>' }}{% for m in messages %}"
    "{% set r = 'system' if m['role'] in ['system', 'developer'] else m['role'] %}"
    "{{ '<|' + r + '|>' }}"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% elif m['content'] %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endif %}"
    "{{ '<|end|>' }}{% endfor %}{{ '<|assistant|>' }}"
)


def byte_alphabet() -> list[str]:
    """The printable character ByteLevel uses for each byte value 0..255 (GPT-2's reversible byte map):
    printable Latin-1 bytes stand for themselves, the others are shifted to code points from 256 up."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    kept = set(keep)
    chars: dict[int, str] = {b: chr(b) for b in keep}
    shift = 0
    for b in range(256):
        if b not in kept:
            chars[b] = chr(256 + shift)
            shift += 1
    return [chars[b] for b in range(256)]


def special_token_names(vocab_size: int) -> list[str]:
    """Names of ids 256..vocab_size-1 in id order."""
    names = [SPECIAL_NAMES[i] for i in range(256, NUM_BASE_IDS)]
    names += [f"<|reserved_{i}|>" for i in range(NUM_BASE_IDS, vocab_size)]
    return names


def export_byte_tokenizer(vocab_size: int, out_dir: Path, model_max_length: int, force: bool = False) -> list[Path]:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` into ``out_dir``;
    returns the paths. Refuses (ValueError) to overwrite an existing tokenizer unless ``force``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    if vocab_size < NUM_BASE_IDS:
        raise ValueError(f"vocab_size={vocab_size} is too small for the byte tokenizer (needs ≥ {NUM_BASE_IDS})")
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{out_dir} exists and is not a directory")
    if (out_dir / "tokenizer.json").exists() and not force:
        raise ValueError(f"{out_dir / 'tokenizer.json'} already exists (use --force to overwrite)")
    vocab = {ch: b for b, ch in enumerate(byte_alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    names = special_token_names(vocab_size)
    tok.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in names])
    for i, n in enumerate(names, start=256):  # the ids must be the server's
        if tok.token_to_id(n) != i:
            raise RuntimeError(f"special token {n} got id {tok.token_to_id(n)}, expected {i}")
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A $B", special_tokens=[("<|bos|>", BOS)]
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "tokenizer.json", out_dir / "tokenizer_config.json", out_dir / "special_tokens_map.json"]
    tok.save(str(paths[0]))
    special = {"bos_token": SPECIAL_NAMES[BOS], "eos_token": SPECIAL_NAMES[EOS]}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }
    paths[1].write_text(json.dumps(config, indent=2) + "\n")
    paths[2].write_text(json.dumps(special, indent=2) + "\n")
    return paths
