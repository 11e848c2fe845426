"""OpenAI-compatible request and response bodies (the subset Vertumnus serves, plus documented extensions).

Unknown fields are ignored. Known OpenAI / vLLM options the decode engines do not implement (``best_of``,
``logit_bias``, ``tools``, ``tool_choice``, ``response_format``, ``functions``, penalties, ``top_k``, ``min_p``,
``suffix``) are accepted only at their no-op value (``None``, ``0``, ``1.0`` for ``repetition_penalty``,
``{"type": "text"}``, …) — any other value is a 400 naming the field, never silently ignored. ``logprobs``
(completions: 0-20 alternatives; chat: ``logprobs`` + ``top_logprobs``) and ``echo`` (completions; not with
``logprobs``: prompt logprobs are not computed) are supported. ``n`` must be 1 and a completions prompt is one
text or one token-id list (a one-element batch is accepted). ``seed`` and token ids are bounded at the edge
(64-bit seed, ids in ``[0, 2**63)``; ids outside the model's vocabulary are a 400 from the tokenizer check).
Extensions (send them through the openai client's ``extra_body``):

- ``ttft_slo_ms``: the request's TTFT SLO τ for SLO accounting (default: ``slo.base_s + slo.per_token_s·L``);
- ``stop_token_ids``: extra token ids that end generation; ``ignore_eos``: do not stop on ``<|eos|>``;
- ``return_token_ids``: add ``token_ids`` (generated ids) to each choice;
- ``return_tokens_as_token_ids`` (vLLM's): logprob tokens as ``token_id:N`` instead of their text.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# torch.Generator.manual_seed and the engines take a signed 64-bit seed; token ids fit an int64 everywhere.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
TokenId = Annotated[int, Field(ge=0, lt=2**63)]


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
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    # extensions
    ttft_slo_ms: float | None = Field(None, gt=0)
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False  # vLLM: logprob tokens as "token_id:N"
    # known options that no decode engine here implements: accepted only at their no-op value (unsupported())
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None

    def unsupported(self) -> str | None:
        """The first option set to a value this server would otherwise have to ignore (None: all honoured)."""
        noop: dict[str, tuple[Any, ...]] = {
            "logit_bias": (None, {}),
            "presence_penalty": (None, 0.0),
            "frequency_penalty": (None, 0.0),
            "repetition_penalty": (None, 1.0),
            "top_k": (None, 0, -1),
            "min_p": (None, 0.0),
            "response_format": (None, {"type": "text"}),
            "tools": (None, []),
            "tool_choice": (None, "none"),
            "functions": (None, []),
            "function_call": (None, "none"),
            **self._more_noop(),
        }
        for name, allowed in noop.items():
            if getattr(self, name) not in allowed:
                return name
        return None

    def _more_noop(self) -> dict[str, tuple[Any, ...]]:
        return {}

    def logprobs_k(self) -> int | None:
        """Alternatives per token to report (None: no logprobs)."""
        return None

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
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    echo: bool = False  # prepend the prompt's text to the completion (supported)
    logprobs: int | None = Field(None, ge=0, le=20)  # each token's logprob and this many alternatives
    best_of: int | None = None
    suffix: str | None = None

    def _more_noop(self) -> dict[str, tuple[Any, ...]]:
        return {"best_of": (None, 1), "suffix": (None, "")}

    def logprobs_k(self) -> int | None:
        return self.logprobs

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
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def logprobs_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None  # {"cached_tokens": P}


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"] | None
    logprobs: dict[str, Any] | None = None
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
    logprobs: dict[str, Any] | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    """As vLLM's server lists a model: ``root`` (the model's source) is read by clients such as
    ``vllm bench serve`` to pick a tokenizer."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "vertumnus"
    root: str
    parent: str | None = None
    max_model_len: int
    permission: list[dict[str, Any]] = Field(default_factory=list)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeRequest(_Body):
    """``POST /tokenize`` (vLLM's shape): a completions ``prompt`` or chat ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True

    @field_validator("messages")
    @classmethod
    def _nonempty(cls, v: list[ChatMessage] | None) -> list[ChatMessage] | None:
        if v is not None and not v:
            raise ValueError("messages must not be empty")
        return v


class DetokenizeRequest(_Body):
    """``POST /detokenize``: token ids back to text."""

    model: str | None = None
    tokens: list[TokenId]


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
