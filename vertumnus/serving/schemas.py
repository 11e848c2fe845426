"""OpenAI-compatible request and response bodies (the subset Vertumnus serves, plus documented extensions).

Requests accept and ignore OpenAI fields that do not change the result's shape (penalties, logit_bias, …);
``n`` must be 1 and a completions prompt is one text or one token-id list (a one-element batch is accepted).
Extensions (send them through the openai client's ``extra_body``):

- ``ttft_slo_ms``: the request's TTFT SLO τ for SLO accounting (default: ``slo.base_s + slo.per_token_s·L``);
- ``stop_token_ids``: extra token ids that end generation; ``ignore_eos``: do not stop on ``<|eos|>``;
- ``return_token_ids``: add ``token_ids`` (generated ids) to each choice.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class _SamplingFields(_Body):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    # extensions
    ttft_slo_ms: float | None = Field(None, gt=0)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        return [s for s in stops if s]

    def stop_list(self) -> list[str]:
        return list(self.stop or [])


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> str | list[int]:
        if isinstance(v, str):
            return v
        if v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError("batched prompts are not supported; send one request per prompt")
            return v[0]  # type: ignore[no-any-return]
        if not v:
            raise ValueError("prompt must not be empty")
        return v  # type: ignore[no-any-return]


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None  # {"cached_tokens": P}


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"] | None
    logprobs: None = None
    token_ids: list[int] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"] | None
    logprobs: None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "vertumnus"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ReconfigureRequest(_Body):
    op: Literal["split", "merge"]
    worker: int
    wait: bool = False  # answer only once the target workers are ACTIVE


class HoldRequest(_Body):
    """``POST /v1/test/hold`` (``serving.test_hooks`` only): hold these workers (omitted: every worker)."""

    workers: list[int] | None = None
    at: Literal["queue", "start"] = "queue"


class ReleaseRequest(_Body):
    """``POST /v1/test/release``: remove the holds of these workers (omitted: every hold)."""

    workers: list[int] | None = None


class FailRequest(_Body):
    """``POST /v1/test/fail``: fail this worker as a dead rank would (it restarts with an empty cache)."""

    worker: int


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorBody(BaseModel):
    error: ErrorInfo
