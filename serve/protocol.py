"""The OpenAI wire format: parsing and checking request bodies, shaping responses and stream chunks.

Nothing here does I/O. `parse_completion` / `parse_chat` turn a decoded JSON body into a
`GenerationRequest` or raise `ApiError` (HTTP status + OpenAI-style error body) naming the field that
was wrong; `engine_error` turns the engine's own `ValueError` (its text names the parameter) into the
same shape. Unknown fields are ignored (and reported by the server in `server.received`); fields we
know but cannot honour (logprobs, echo, tools, penalties ...) are refused with a 400 rather than
silently dropped.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from inferledger.engine.params import SamplingParams

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
ROLES = ("system", "user", "assistant", "tool", "developer")
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions

_COMMON = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "seed",
           "stop", "stop_token_ids", "n", "ignore_eos", "min_tokens", "user", "best_of", "logprobs",
           "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "response_format"}
KNOWN_FIELDS = {
    COMPLETIONS: _COMMON | {"prompt", "echo", "suffix"},
    CHAT: _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                     "parallel_tool_calls", "add_generation_prompt"},
}
# Fields we understand but do not implement: refused unless they hold their neutral value.
_UNSUPPORTED = {
    "logprobs": lambda v: v in (None, False, 0), "top_logprobs": lambda v: v in (None, 0),
    "echo": lambda v: v in (None, False), "suffix": lambda v: v in (None, ""),
    "presence_penalty": lambda v: v in (None, 0), "frequency_penalty": lambda v: v in (None, 0),
    "repetition_penalty": lambda v: v in (None, 1), "logit_bias": lambda v: not v,
    "tools": lambda v: not v, "tool_choice": lambda v: v in (None, "none", "auto"),
    "response_format": lambda v: v is None or (isinstance(v, dict) and v.get("type") == "text"),
}


class ApiError(Exception):
    """An HTTP error with an OpenAI-style body: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class GenerationRequest:
    endpoint: str
    model: str | None
    stream: bool
    include_usage: bool
    sampling: dict  # SamplingParams fields the client set (max_tokens may be missing)
    max_tokens_field: str = "max_tokens"  # the name the client used (chat: max_completion_tokens)
    prompt: str | list[int] | None = None
    messages: list[dict] | None = None
    ignored_fields: list[str] = field(default_factory=list)

    @property
    def prompt_field(self) -> str:
        return "messages" if self.endpoint == CHAT else "prompt"

    def params(self, max_tokens: int) -> SamplingParams:
        """The engine's SamplingParams; its ValueError names the parameter out of range."""
        return SamplingParams(**{**self.sampling, "max_tokens": self.sampling.get("max_tokens", max_tokens)})


# -- field checks ---------------------------------------------------------------------------------
def _type_name(v) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


def _bad(name: str, expected: str, v) -> ApiError:
    shown = json.dumps(v)[:60] if not isinstance(v, (dict, list)) else _type_name(v)
    return ApiError(400, f"'{name}' must be {expected}, got {_type_name(v)} ({shown})", param=name,
                    code="invalid_type")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _opt(body: dict, name: str, check, expected: str):
    v = body.get(name)
    if v is not None and not check(v):
        raise _bad(name, expected, v)
    return v


def _common(body: dict, endpoint: str) -> GenerationRequest:
    for name, neutral in _UNSUPPORTED.items():
        if name in KNOWN_FIELDS[endpoint] and not neutral(body.get(name)):
            raise ApiError(400, f"'{name}' is not supported by this server; remove it from the request",
                           param=name, code="unsupported_parameter")
    model = _opt(body, "model", lambda v: isinstance(v, str), "a string")
    stream = _opt(body, "stream", lambda v: isinstance(v, bool), "true or false") or False
    opts = _opt(body, "stream_options", lambda v: isinstance(v, dict), "an object")
    include_usage = False
    if opts is not None:
        if not stream:
            raise ApiError(400, "'stream_options' is only allowed when 'stream' is true", param="stream_options")
        include_usage = _opt(opts, "include_usage", lambda v: isinstance(v, bool), "true or false") or False
    s: dict = {}
    for name, check, expected in (
            ("max_tokens", _is_int, "an integer"), ("min_tokens", _is_int, "an integer"),
            ("temperature", _is_num, "a number"), ("top_p", _is_num, "a number"),
            ("top_k", _is_int, "an integer"), ("seed", _is_int, "an integer"), ("n", _is_int, "an integer"),
            ("ignore_eos", lambda v: isinstance(v, bool), "true or false"),
            ("stop", lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
             "a string or an array of strings"),
            ("stop_token_ids", lambda v: isinstance(v, list) and all(_is_int(x) for x in v),
             "an array of integers")):
        v = _opt(body, name, check, expected)
        if v is not None:
            s[name] = v
    s.setdefault("temperature", 1.0)  # OpenAI's default; send 0 for greedy
    best_of = _opt(body, "best_of", _is_int, "an integer")
    if best_of is not None and best_of != s.get("n", 1):
        raise ApiError(400, "'best_of' different from 'n' is not supported by this server", param="best_of",
                       code="unsupported_parameter")
    _opt(body, "user", lambda v: isinstance(v, str), "a string")
    ignored = sorted(k for k in body if k not in KNOWN_FIELDS[endpoint])
    return GenerationRequest(endpoint, model, stream, include_usage, s, ignored_fields=ignored)


def parse_completion(body: dict) -> GenerationRequest:
    req = _common(body, COMPLETIONS)
    if "prompt" not in body or body["prompt"] is None:
        raise ApiError(400, "'prompt' is required: a string or an array of token ids", param="prompt",
                       code="missing_field")
    p = body["prompt"]
    if isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
        if len(p) > 1:
            raise ApiError(400, f"'prompt' holds {len(p)} prompts; this server takes one prompt per request",
                           param="prompt", code="unsupported_parameter")
        p = p[0]  # a batch of one
    if isinstance(p, list):
        if not all(_is_int(x) for x in p):
            raise _bad("prompt", "a string or an array of token ids (integers)", p)
    elif not isinstance(p, str):
        raise _bad("prompt", "a string or an array of token ids", p)
    req.prompt = p
    return req


def _content(i: int, m: dict):
    c = m.get("content")
    if c is None or isinstance(c, str):
        return c if c is not None else ""
    if isinstance(c, list):  # content parts: only text can be rendered by a text-only model
        texts = []
        for j, part in enumerate(c):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"'messages[{i}].content[{j}]' must be a text part "
                                    "{\"type\": \"text\", \"text\": ...}; this model reads text only",
                               param=f"messages[{i}].content[{j}]", code="invalid_type")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(f"messages[{i}].content", "a string, an array of text parts or null", c)


def parse_chat(body: dict) -> GenerationRequest:
    req = _common(body, CHAT)
    mct = _opt(body, "max_completion_tokens", _is_int, "an integer")
    if mct is not None:  # the newer name wins, as in OpenAI's API
        req.sampling["max_tokens"], req.max_tokens_field = mct, "max_completion_tokens"
    msgs = body.get("messages")
    if msgs is None:
        raise ApiError(400, "'messages' is required: an array of {role, content} objects", param="messages",
                       code="missing_field")
    if not isinstance(msgs, list):
        raise _bad("messages", "an array of {role, content} objects", msgs)
    if not msgs:
        raise ApiError(400, "'messages' is empty: send at least one message", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}]", "an object with 'role' and 'content'", m)
        role = m.get("role")
        if role not in ROLES:
            raise ApiError(400, f"'messages[{i}].role' must be one of {', '.join(ROLES)}, got {json.dumps(role)}",
                           param=f"messages[{i}].role", code="invalid_value")
        msg = {"role": role, "content": _content(i, m)}
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    req.messages = out
    return req


# -- engine errors --------------------------------------------------------------------------------
_PARAM = re.compile(r"^(\w+)=")


def engine_error(exc: ValueError, req: GenerationRequest) -> ApiError:
    """The engine's / SamplingParams' ValueError as a 400 whose param is the field the client sent."""
    msg = str(exc)
    m = _PARAM.match(msg)
    if m:
        name = m.group(1)
        return ApiError(400, msg, param=req.max_tokens_field if name == "max_tokens" else name, code="invalid_value")
    if "max_model_len" in msg:
        return ApiError(400, msg, param=req.prompt_field, code="context_length_exceeded")
    if msg.startswith("prompt_token_ids"):
        return ApiError(400, msg.replace("prompt_token_ids", req.prompt_field, 1), param=req.prompt_field,
                        code="invalid_prompt")
    if "KV blocks" in msg:
        return ApiError(400, msg, param=req.max_tokens_field, code="kv_cache_exceeded")
    if msg.startswith("chat template"):
        return ApiError(400, msg, param="messages", code="invalid_messages")
    return ApiError(400, msg, code="invalid_request")


# -- responses ------------------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    u = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
         "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return u


@dataclass
class Shaper:
    """Builds one response's bodies and chunks (same id, created time and model throughout)."""

    endpoint: str
    id: str
    created: int
    model: str
    include_usage: bool = False

    @property
    def chat(self) -> bool:
        return self.endpoint == CHAT

    def _chunk(self, choices: list[dict]) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        c = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if self.include_usage:
            c["usage"] = None
        return c

    def role_chunk(self, index: int) -> dict:
        return self._chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}])

    def text_chunk(self, index: int, text: str, finish_reason: str | None = None) -> dict:
        if self.chat:
            delta = {"content": text} if text else {}
            return self._chunk([{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}])
        return self._chunk([{"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}])

    def usage_chunk(self, u: dict) -> dict:
        c = self._chunk([])
        c["usage"] = u
        return c

    def response(self, outputs: list, u: dict) -> dict:
        """The non-streaming body; outputs are the engine's CompletionOutputs (index, text, finish_reason)."""
        if self.chat:
            choices = [{"index": o.index, "message": {"role": "assistant", "content": o.text}, "logprobs": None,
                        "finish_reason": o.finish_reason} for o in outputs]
            obj = "chat.completion"
        else:
            choices = [{"index": o.index, "text": o.text, "logprobs": None, "finish_reason": o.finish_reason}
                       for o in outputs]
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                "usage": u}


def sse(payload) -> bytes:
    """One server-sent event: `data: <json>` (or the literal [DONE]) and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return b"data: " + data.encode() + b"\n\n"


__all__ = ["ApiError", "GenerationRequest", "Shaper", "parse_completion", "parse_chat", "engine_error", "usage",
           "sse", "COMPLETIONS", "CHAT",
           "DEFAULT_COMPLETION_MAX_TOKENS"]
