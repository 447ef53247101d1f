"""What goes over the wire: OpenAI's request fields, turned into the engine's SamplingParams, and
OpenAI's response, chunk and error shapes. Free of PyTorch and of the web framework.

Field names are OpenAI's (`max_tokens`, `temperature`, `top_p`, `seed`, `n`, `stream`), with three of
vLLM's extensions (`top_k`, `repetition_penalty`, `ignore_eos`) and vLLM's `return_token_ids`. A field
left out takes MiniMind's `generate` default (temperature 0.85, top_p 0.85, top_k 50, no repetition
penalty), since the engine's contract is `generate`'s semantics; `temperature: 0` is greedy (OpenAI's
meaning; MiniMind refuses it). A missing `max_tokens` is `generate`'s 8192 cut to what the model's
positions and the pool hold for this prompt (vLLM's default). Generation stops at the tokenizer's eos.
Every refusal is a 400 in OpenAI's error shape that names the field (`param`).
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from kvlab.serving import SamplingParams, ServingConfig

# MiniMind's generate defaults (kvlab.engine.model.generate, kvlab.serving.SamplingParams).
GENERATE_DEFAULTS = {"temperature": 0.85, "top_p": 0.85, "top_k": 50, "repetition_penalty": 1.0}
GENERATE_MAX_NEW_TOKENS = 8192
# OpenAI's fields this server does not implement, with the value that means "not used".
NOT_IMPLEMENTED = {"stop": None, "frequency_penalty": 0.0, "presence_penalty": 0.0, "logprobs": None, "echo": False,
                   "best_of": None, "logit_bias": None, "suffix": None, "tools": None, "response_format": None}
FINISH_REASONS = {"eos": "stop", "length": "length", "abort": "abort"}
UNION_MEMBER = re.compile(r"^(str|int|float|bool|dict|[\w-]+\[.*\])$")


class ApiError(Exception):
    """A refusal in OpenAI's shape: HTTP `status`, a message, the field it is about (`param`)."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad_request(param: str | None, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}" if param else message, param)


# --- requests ----------------------------------------------------------------------------------

class StreamOptions(BaseModel):
    include_usage: bool = True


class Sampled(BaseModel):
    """The fields both endpoints share. Unknown fields are ignored, as vLLM ignores them."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False

    @property
    def include_usage(self) -> bool:
        """Usage in a last chunk of its own (OpenAI's `stream_options.include_usage`): on unless turned off."""
        return self.stream_options is None or self.stream_options.include_usage


class CompletionRequest(Sampled):
    prompt: str | list[int] | list[str] | list[list[int]]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict] | None = None


class ChatRequest(Sampled):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None


@dataclass(frozen=True)
class Limits:
    """What the served model and engine can hold, to check a request against before it is queued."""

    model_name: str
    vocab_size: int
    max_positions: int
    eos_token_id: int
    serving: ServingConfig


def check_model(request: Sampled, limits: Limits) -> None:
    if request.model is not None and request.model != limits.model_name:
        raise ApiError(400, f"model: '{request.model}' is not served here; this server serves '{limits.model_name}' "
                       f"(GET /v1/models)", "model", code="model_not_found")


def check_implemented(request: Sampled) -> None:
    extra = request.model_extra or {}
    for field, unused in NOT_IMPLEMENTED.items():
        value = extra.get(field, unused)
        if value not in (unused, [], "") and not (field == "best_of" and value == 1):
            raise bad_request(field, "not implemented by kvlab serve (generation stops at the tokenizer's eos or "
                                     "max_tokens)")


def completion_prompt(request: CompletionRequest, encode) -> list[int]:
    """The prompt's token ids: a string (encoded) or a list of ids; a batch of one is taken as that one."""
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise bad_request("prompt", f"one prompt per request (got a batch of {len(prompt)})")
        prompt = prompt[0]
    ids = encode(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise bad_request("prompt", "empty: a request needs at least one token")
    return ids


def message_text(message: ChatMessage, index: int) -> str:
    if isinstance(message.content, str):
        return message.content
    if message.content is None:
        return ""
    parts = []
    for part in message.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_request(f"messages[{index}].content", "only text parts ({'type': 'text', 'text': ...})")
        parts.append(part["text"])
    return "".join(parts)


def chat_prompt(request: ChatRequest, tokenizer) -> list[int]:
    """The messages rendered with the tokenizer's chat template, ready for the assistant's turn."""
    if not request.messages:
        raise bad_request("messages", "at least one message")
    messages = [{"role": message.role, "content": message_text(message, index)}
                for index, message in enumerate(request.messages)]
    return tokenizer.encode(tokenizer.chat_text(messages, add_generation_prompt=True))


def room(prompt_len: int, n: int, limits: Limits) -> int:
    """The most new tokens a request can ask for: what the model's positions and the pool hold (the
    engine's own check, ServingEngine.check_request, solved for max_tokens)."""
    return min(limits.max_positions - prompt_len + 1, limits.serving.room(prompt_len, n))


def sampling_params(request: Sampled, prompt: list[int], limits: Limits, max_tokens: int | None) -> SamplingParams:
    """The engine's knobs for a request, each field checked, a refusal naming it."""
    max_field = "max_completion_tokens" if isinstance(request, ChatRequest) and request.max_completion_tokens else \
        "max_tokens"
    prompt_field = "messages" if isinstance(request, ChatRequest) else "prompt"
    if min(prompt) < 0 or max(prompt) >= limits.vocab_size:
        raise bad_request(prompt_field, f"token ids must lie in 0 .. {limits.vocab_size - 1}")
    if not 1 <= request.n <= limits.serving.max_num_seqs:
        raise bad_request("n", f"must be between 1 and {limits.serving.max_num_seqs} (the engine's max_num_seqs: "
                               f"a request's samples run together), got {request.n}")
    left = room(len(prompt), request.n, limits)
    if left < 1:
        pool = limits.serving.num_blocks * limits.serving.block_size
        raise bad_request(prompt_field, f"{len(prompt)} tokens: longer than the model holds "
                                        f"({limits.max_positions} positions) or the pool ({pool} tokens"
                                        f"{f' for n={request.n}' if request.n > 1 else ''})")
    if not limits.serving.chunked_prefill and len(prompt) > limits.serving.max_num_batched_tokens:
        raise bad_request(prompt_field, f"{len(prompt)} tokens: more than one step feeds "
                                        f"(max_num_batched_tokens {limits.serving.max_num_batched_tokens}, "
                                        f"no chunked prefill)")
    if max_tokens is None:
        max_tokens = min(GENERATE_MAX_NEW_TOKENS, left)
    elif max_tokens < 1:
        raise bad_request(max_field, f"must be >= 1, got {max_tokens}")
    elif max_tokens > left:
        raise bad_request(max_field, f"{max_tokens} new tokens after a {len(prompt)}-token prompt do not fit: at most "
                                     f"{left} (the model's {limits.max_positions} positions, the pool's "
                                     f"{limits.serving.num_blocks} blocks of {limits.serving.block_size})")
    knobs = {field: GENERATE_DEFAULTS[field] if getattr(request, field) is None else getattr(request, field)
             for field in GENERATE_DEFAULTS}
    if knobs["temperature"] < 0:
        raise bad_request("temperature", f"must be >= 0 (0 is greedy), got {knobs['temperature']}")
    if not 0 < knobs["top_p"] <= 1:
        raise bad_request("top_p", f"must be in (0, 1], got {knobs['top_p']}")
    if knobs["top_k"] < -1:
        raise bad_request("top_k", f"must be >= 0 (0 or -1: off), got {knobs['top_k']}")
    if knobs["repetition_penalty"] <= 0:
        raise bad_request("repetition_penalty", f"must be > 0 (1: off), got {knobs['repetition_penalty']}")
    if request.seed is not None and not 0 <= request.seed < 2**63:
        raise bad_request("seed", f"must be in 0 .. 2**63 - 1, got {request.seed}")
    greedy = knobs["temperature"] == 0
    return SamplingParams(
        max_tokens=max_tokens, temperature=1.0 if greedy else knobs["temperature"], top_p=knobs["top_p"],
        top_k=max(0, knobs["top_k"]), repetition_penalty=knobs["repetition_penalty"], do_sample=not greedy,
        seed=request.seed, eos_token_id=None if request.ignore_eos else limits.eos_token_id, n=request.n)


def field_path(location) -> str | None:
    """OpenAI's `param` for a pydantic error location: ('body', 'messages', 0, 'role') is messages[0].role;
    a union member's name (pydantic puts 'str', 'list[int]' after the field) is not part of it."""
    path = ""
    for part in location:
        if part == "body" and not path:
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        elif UNION_MEMBER.match(part):
            break
        else:
            path += f".{part}" if path else part
    return path or None


def validation_error(errors: list[dict]) -> ApiError:
    """FastAPI's RequestValidationError (malformed JSON, a missing field, one of the wrong type) as a 400
    naming the first field."""
    error = errors[0]
    if error.get("type") == "json_invalid":
        where = error.get("loc", ())[1:2]  # FastAPI gives the character where decoding stopped
        at = f" at character {where[0]}" if where and isinstance(where[0], int) else ""
        return ApiError(400, f"the body is not valid JSON{at}: {error.get('ctx', {}).get('error', error['msg'])}")
    param = field_path(error.get("loc", ()))
    if param is None:
        return ApiError(400, f"the body must be a JSON object of OpenAI's fields ({error['msg']})")
    return bad_request(param, error["msg"])


# --- responses -----------------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


@dataclass
class Shape:
    """How one endpoint's responses look: completions carry `text`, chat a `message` or `delta`."""

    chat: bool
    model: str
    response_id: str
    created: int

    @classmethod
    def of(cls, chat: bool, model: str) -> "Shape":
        return cls(chat, model, new_id("chatcmpl" if chat else "cmpl"), int(time.time()))

    def head(self, stream: bool) -> dict:
        kind = ("chat.completion.chunk" if stream else "chat.completion") if self.chat else "text_completion"
        return {"id": self.response_id, "object": kind, "created": self.created, "model": self.model}

    def choice(self, index: int, text: str, finish_reason: str | None, token_ids: list[int] | None,
               stream: bool, role: bool = False) -> dict:
        if not self.chat:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}
        elif stream:
            delta = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return choice

    def chunk(self, choices: list[dict], usage_: dict | None = None) -> dict:
        body = {**self.head(stream=True), "choices": choices}
        if usage_ is not None:
            body["usage"] = usage_
        return body

    def response(self, choices: list[dict], usage_: dict, prompt_ids: list[int] | None) -> dict:
        body = {**self.head(stream=False), "choices": choices, "usage": usage_}
        if prompt_ids is not None:
            body["prompt_token_ids"] = prompt_ids
        return body
