"""Model and tokenizer endpoints of the OpenAI / vLLM surface::

GET  /v1/models          the served model (with ``root``: where a client finds its tokenizer)
GET  /v1/models/{id}     that model, or 404 model_not_found
POST /tokenize           {"prompt": str | "messages": [...], "add_special_tokens"} -> {"tokens", "count",
                         "max_model_len"} (vLLM's shape; chat messages go through the chat template)
POST /detokenize         {"tokens": [ids]} -> {"prompt": str}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request

from vertumnus.config import VertumnusConfig
from vertumnus.serving.errors import APIError, check_model
from vertumnus.serving.request_validation import parse_body
from vertumnus.serving.schemas import DetokenizeRequest, ModelCard, ModelList, TokenizeRequest
from vertumnus.serving.tokenizer import ChatTurn, Tokenizer

# The tokenizer the repository ships for the default tiny model (vertumnus tokenizer export).
SHIPPED_TOKENIZER = Path(__file__).resolve().parents[2] / "configs" / "tokenizers" / "vertumnus-tiny"
SHIPPED_VOCAB = 512


def model_root(cfg: VertumnusConfig) -> str:
    """What ``root`` names: the Hugging Face tokenizer directory when one is configured, else the model's
    weights directory, else (byte tokenizer) the shipped tokenizer directory when its vocabulary matches the
    model's, else the model name. Clients such as ``vllm bench serve`` load their tokenizer from it."""
    if cfg.serving.tokenizer:
        return str(Path(cfg.serving.tokenizer).resolve())
    if cfg.model.path:
        return str(Path(cfg.model.path).resolve())
    if cfg.model.vocab_size == SHIPPED_VOCAB and (SHIPPED_TOKENIZER / "tokenizer.json").exists():
        return str(SHIPPED_TOKENIZER)
    return cfg.model.name


def add_model_routes(app: FastAPI, cfg: VertumnusConfig, tok: Tokenizer) -> None:
    """Register the routes in the module docstring on ``app``."""
    card = ModelCard(id=cfg.model.name, root=model_root(cfg), max_model_len=cfg.pool.max_model_len)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return ModelList(data=[card]).model_dump()

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        check_model(model_id, cfg.model.name)
        return card.model_dump()

    @app.post("/tokenize")
    async def tokenize(raw: Request) -> dict[str, Any]:
        body = await parse_body(raw, TokenizeRequest)
        check_model(body.model, cfg.model.name)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "send exactly one of `prompt` and `messages`", param="prompt", code="invalid_value")
        if body.messages is not None:
            ids = tok.apply_chat_template([ChatTurn(m.role, m.text()) for m in body.messages])
        else:
            ids = tok.encode(body.prompt or "", add_bos=body.add_special_tokens)
        return {"count": len(ids), "max_model_len": cfg.pool.max_model_len, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(raw: Request) -> dict[str, Any]:
        body = await parse_body(raw, DetokenizeRequest)
        check_model(body.model, cfg.model.name)
        try:
            tok.check_ids(body.tokens)
        except ValueError as e:
            raise APIError(400, str(e), param="tokens", code="invalid_token_ids") from None
        return {"prompt": tok.decode(body.tokens)}
