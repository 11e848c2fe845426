"""The Hugging Face tokenizer adapter (serving.tokenizer) on a tokenizer built here (nothing downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vertumnus.serving.tokenizer import ChatTurn, TextStream, make_tokenizer

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE(unk_token=None))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    t.train_from_iterator(["hello world, prefill pool", "Grüße 世界", "split merge epoch"] * 20, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>")
    fast.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    d = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 7]}))
    return d


def test_encode_decode_chat_and_end_ids(tok_dir: Path) -> None:
    tok = make_tokenizer(str(tok_dir), 512)
    text = "hello Grüße 世界"
    ids = tok.encode(text, add_bos=False)
    assert tok.decode(ids) == text
    assert tok.eos_ids == frozenset({1, 7}) and tok.chat_end_ids == tok.eos_ids
    chat = tok.apply_chat_template([ChatTurn("developer", "be brief"), ChatTurn("user", "hi")])
    assert tok.decode(chat) == "<system>be brief<user>hi<assistant>"
    with pytest.raises(ValueError, match=r"\[0, "):
        tok.check_ids([tok.vocab_size])


def test_generic_text_stream_never_emits_half_characters(tok_dir: Path) -> None:
    tok = make_tokenizer(str(tok_dir), 512)
    ids = tok.encode("Grüße 世界 pool", add_bos=False)
    s = TextStream(tok, stop=["pool"])
    out = "".join(s.feed([i]) for i in ids) + s.flush()
    assert "\ufffd" not in out
    assert out == "Grüße 世界 " and s.stopped


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a directory"):
        make_tokenizer(str(tmp_path / "nope"), 512)
