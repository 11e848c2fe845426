"""Tokenizer, chat template, incremental detokenizer with stop strings, request schemas, sampler, error bodies."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from vertumnus.serving.errors import error_body
from vertumnus.serving.sampling import Sampler, SamplingParams
from vertumnus.serving.schemas import ChatCompletionRequest, CompletionRequest
from vertumnus.serving.tokenizer import ASSISTANT, BOS, END, EOS, SYSTEM, USER, ByteTokenizer, ChatTurn, TextStream

TOK = ByteTokenizer(512)


def test_encode_decode_roundtrip_utf8() -> None:
    text = "Grüße, 世界! 🙂"
    ids = TOK.encode(text)
    assert ids[0] == BOS
    assert ids[1:] == list(text.encode("utf-8"))
    assert TOK.decode(ids) == text  # BOS decodes to nothing
    assert TOK.encode("ab", add_bos=False) == [97, 98]


def test_reserved_and_special_ids_decode_to_nothing() -> None:
    assert TOK.decode([104, EOS, 300, 511, 105]) == "hi"


def test_vocab_too_small_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="vocab_size=200 is too small"):
        ByteTokenizer(200)


def test_check_ids_bounds() -> None:
    TOK.check_ids([0, 511])
    with pytest.raises(ValueError, match=r"\[0, 512\)"):
        TOK.check_ids([1, 512])
    with pytest.raises(ValueError):
        TOK.check_ids([-1])


def test_chat_template_layout() -> None:
    ids = TOK.apply_chat_template([ChatTurn("system", "S"), ChatTurn("user", "hi")])
    assert ids == [BOS, SYSTEM, ord("S"), END, USER, ord("h"), ord("i"), END, ASSISTANT]
    with pytest.raises(ValueError, match="unsupported chat role 'tool'"):
        TOK.apply_chat_template([ChatTurn("tool", "x")])


def test_text_stream_holds_back_possible_stop_prefix_and_cuts_at_stop() -> None:
    s = TextStream(TOK, stop=["END"])
    assert s.feed(TOK.encode("abcE", add_bos=False)) == "ab"  # "cE" could start "END"
    assert s.feed(TOK.encode("Nx", add_bos=False)) == "cE"  # "cENx": no stop; the last 2 chars are held
    assert s.text == "abcE"
    assert s.feed(TOK.encode("yEND tail", add_bos=False)) == "Nxy"  # stop spans the held "Nx" + new text
    assert s.stopped
    assert s.feed(TOK.encode("more", add_bos=False)) == ""
    assert s.text == "abcENxy"


def test_text_stream_flush_and_split_utf8() -> None:
    s = TextStream(TOK)
    euro = "€".encode()
    assert s.feed([euro[0]]) == ""  # incomplete character is buffered
    assert s.feed([euro[1], euro[2], ord("!")]) == "€!"
    assert s.feed([euro[0]]) == ""
    assert s.flush() == "\ufffd"  # incomplete tail at the end becomes U+FFFD
    assert s.text == "€!\ufffd"


def test_completion_schema_accepts_openai_shapes_and_rejects_batches() -> None:
    assert CompletionRequest.model_validate({"model": "m", "prompt": "x"}).prompt == "x"
    assert CompletionRequest.model_validate({"model": "m", "prompt": [1, 2]}).prompt == [1, 2]
    assert CompletionRequest.model_validate({"model": "m", "prompt": ["only"]}).prompt == "only"
    assert CompletionRequest.model_validate({"model": "m", "prompt": [[3, 4]]}).prompt == [3, 4]
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "stop": "\n", "presence_penalty": 0.5})
    assert req.stop_list() == ["\n"]
    with pytest.raises(ValidationError, match="batched prompts"):
        CompletionRequest.model_validate({"model": "m", "prompt": ["a", "b"]})
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": "x", "n": 2})
    with pytest.raises(ValidationError, match="at most 4 stop"):
        CompletionRequest.model_validate({"model": "m", "prompt": "x", "stop": list("abcde")})
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": "x", "ttft_slo_ms": 0})


def test_chat_schema_text_parts() -> None:
    req = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        }
    )
    assert req.messages[0].text() == "ab"
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"model": "m", "messages": []})


def test_sampler_greedy_seeded_and_top_p() -> None:
    logits = torch.tensor([0.0, 3.0, 2.9, -1.0])
    assert Sampler(SamplingParams(temperature=0.0)).sample(logits) == 1
    a = Sampler(SamplingParams(temperature=1.0, seed=7))
    b = Sampler(SamplingParams(temperature=1.0, seed=7))
    draws_a = [a.sample(logits) for _ in range(20)]
    assert draws_a == [b.sample(logits) for _ in range(20)]
    assert set(draws_a) <= {0, 1, 2, 3}
    # top_p small enough keeps only the most likely token
    c = Sampler(SamplingParams(temperature=1.0, top_p=0.05, seed=3))
    assert {c.sample(logits) for _ in range(20)} == {1}


def test_error_body_shape() -> None:
    assert error_body(429, "slow down", None, "rate_limit_exceeded") == {
        "error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": "rate_limit_exceeded"}
    }
