"""A request body checked and turned into a ``Generation``: pure, given only what it needs of
the model (``ModelView``: its name, vocabulary size, context, tokenizer, chat template and
sampling defaults), so that every rule can be tested without loading a bundle.

Every refusal is a ``BadRequest``: one line naming the parameter, the value and the rule, with
the parameter, an error code and an HTTP status for OpenAI's error object.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from ...errors import IronError
from ..chat import ChatError, ChatTemplate
from ..generate import SAMPLING_RULES, SamplingError, Sampler

#: llama.cpp's server's sampling defaults, used where the checkpoint's generation_config.json
#: does not set a value
LLAMA_SERVER_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
                         "repetition_penalty": 1.0}

#: the request parameters each endpoint knows; anything else is refused, naming it
COMMON = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k",
          "min_p", "seed", "stop", "frequency_penalty", "presence_penalty",
          "repetition_penalty", "ignore_eos", "n", "user", "response_format", "logprobs",
          "logit_bias"}
KNOWN = {True: COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools",
                         "tool_choice", "parallel_tool_calls", "functions", "function_call"},
         False: COMMON | {"prompt", "echo", "suffix", "best_of"}}
#: known parameters the server does not do, refused when set to anything but "off"
UNSUPPORTED = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
               "logprobs", "top_logprobs", "logit_bias", "echo", "suffix")
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
            "presence_penalty")
#: OpenAI's limit on stop strings
MAX_STOP = 4


class BadRequest(IronError, ValueError):
    """A request the server refuses: its status, message, offending parameter and code."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 status: int = 400, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = (message, param, code,
                                                                       status, kind)
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


@dataclass
class ModelView:
    """What parsing a request needs to know of the model being served."""

    name: str  # the model id clients may ask for
    vocab_size: int
    context: int  # positions, prompt and answer together
    tokenizer: Any  # a tokenizers.Tokenizer
    token_chars: int  # the most characters one token stands for
    defaults: Mapping[str, Any] = field(default_factory=lambda: dict(LLAMA_SERVER_SAMPLING))
    template: ChatTemplate | None = None
    template_error: str = "this model has no chat template"


@dataclass
class Generation:
    """A request's validated parameters. ``schema`` (a JSON schema, or None for free text) is
    compiled into a grammar by the server, which then wraps ``sampler``."""

    prompt: list[int]
    max_tokens: int
    sampler: Any  # a Sampler, or a grammar-constrained one
    stop: list[str]
    stream: bool
    include_usage: bool
    ignore_eos: bool = False
    schema: dict | bool | None = None


def parse_json(raw: bytes) -> Any:
    """The request body as JSON: strict (no NaN, no raw control characters in strings),
    refused in one line otherwise."""
    def constant(name):
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(raw, parse_constant=constant)
    except RecursionError:
        raise BadRequest("the request body is nested too deeply", None,
                         "invalid_json") from None
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError included
        raise BadRequest(f"the request body is not valid JSON ({e})", None,
                         "invalid_json") from None


def check_text(body: Any) -> None:
    """Refuse a lone surrogate (``"\\ud800"``: valid JSON, not text) anywhere in the request,
    naming where: nothing downstream (tokenizer, template, grammar) takes one."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                check_string(f"{path} key {key!r}" if path else f"key {key!r}", key)
                stack.append((f"{path}.{key}" if path else key, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, str):
            check_string(path, value)


def check_string(path: str, text: str) -> None:
    """Refuse ``text``, found at ``path`` of the body, if it holds a lone surrogate; the
    parameter named is the top-level one it is in (none for a top-level key)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        param = None if path.startswith("key ") else path.split(".")[0].split("[")[0].split(
            " ")[0] or None
        raise BadRequest(f"{path}: character {e.start} is a lone surrogate "
                         f"(U+{ord(text[e.start]):04X}), not text", param,
                         "invalid_value") from None


def parse_body(raw: bytes, chat: bool, model: ModelView) -> Generation:
    """A request body's bytes as a ``Generation``, or ``BadRequest``."""
    body = parse_json(raw)
    check_text(body)
    return parse(body, chat, model)


def number(body: dict, name: str, default: Any, integer: bool = False) -> Any:
    """``body[name]``, a number (an integer if ``integer``), or ``default`` if absent or null."""
    value = body.get(name, default)
    if value is None:
        return default
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise BadRequest(f"{name}={value!r}: must be {'an integer' if integer else 'a number'}",
                         name, "invalid_type")
    return value


def flag(body: dict, name: str) -> bool:
    """``body[name]``, true or false (false if absent)."""
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise BadRequest(f"{name}={value!r}: must be true or false", name, "invalid_type")
    return value


def parse(body: Any, chat: bool, model: ModelView) -> Generation:
    """A decoded request body of a chat (``chat``) or completion request as a
    ``Generation``, or ``BadRequest``."""
    if not isinstance(body, dict):
        raise BadRequest(f"the request body is a JSON {type(body).__name__}; it must be a JSON "
                         "object")
    check_known(body, chat)
    name = body.get("model")
    if name is not None and not isinstance(name, str):
        raise BadRequest(f"model={name!r}: must be a string", "model", "invalid_type")
    if name is not None and name != model.name:
        raise BadRequest(f"the model {name!r} does not exist: this server serves "
                         f"{model.name!r}", "model", "model_not_found", status=404)
    for one in ("n", "best_of"):
        if number(body, one, 1, integer=True) != 1:
            raise BadRequest(f"{one}={body[one]!r}: only {one}=1 is supported", one,
                             "unsupported")
    schema = response_schema(body.get("response_format"))
    prompt = chat_prompt(body, model) if chat else completion_prompt(body, model)
    max_tokens = parse_max_tokens(body, chat, len(prompt), model.context)
    sampler = parse_sampler(body, model.defaults)
    stream = flag(body, "stream")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise BadRequest(f"stream_options={shorten(stream_options)}: must be an object",
                         "stream_options", "invalid_type")
    ignore_eos = flag(body, "ignore_eos")
    if schema is not None and ignore_eos:
        raise BadRequest("ignore_eos=true cannot be combined with response_format: the "
                         "answer ends where the document does", "ignore_eos", "invalid_value")
    return Generation(prompt, max_tokens, sampler, parse_stop(body.get("stop")), stream,
                      bool(stream_options.get("include_usage")), ignore_eos, schema)


def check_known(body: dict, chat: bool) -> None:
    """Refuse a parameter the endpoint does not know, and one it knows but does not do."""
    unknown = sorted(set(body) - KNOWN[chat])
    if unknown:
        raise BadRequest(f"unrecognized request argument supplied: {', '.join(unknown)}",
                         unknown[0], "unknown_parameter")
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False, [], {}) and not (
                name == "tool_choice" and body[name] == "none"):
            raise BadRequest(f"{name}={body[name]!r}: {name} is not supported by this server",
                             name, "unsupported")


def parse_max_tokens(body: dict, chat: bool, prompt_tokens: int, context: int) -> int:
    """The answer's length limit: ``max_completion_tokens`` (chat) or ``max_tokens``, at least
    1 and within the context that the prompt leaves; by default all of it for a chat, 16 for a
    completion (OpenAI's legacy default)."""
    if prompt_tokens > context - 1:
        raise BadRequest(f"the prompt is {prompt_tokens} tokens; the context holds {context} "
                         "positions, at least one of them for the answer",
                         "messages" if chat else "prompt", "context_length_exceeded")
    room = context - prompt_tokens
    default = room if chat else min(16, room)
    key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = number(body, key, default, integer=True)
    if max_tokens < 1:
        raise BadRequest(f"{key}={max_tokens}: must be at least 1", key, "invalid_value")
    if max_tokens > room:
        raise BadRequest(f"{key}={max_tokens} does not fit: the prompt is {prompt_tokens} "
                         f"tokens and the context {context} positions, so at most {room}", key,
                         "context_length_exceeded")
    return max_tokens


def parse_sampler(body: dict, defaults: Mapping[str, Any]) -> Sampler:
    """The sampler the request's parameters (else ``defaults``) describe; a value out of its
    range is refused naming it (``Sampler``'s rules)."""
    options = {name: number(body, name, defaults.get(name, 0.0), integer=name == "top_k")
               for name in SAMPLING}
    seed = body.get("seed")
    if seed is not None:
        seed = number(body, "seed", 0, integer=True)
    try:
        return Sampler(seed=seed, **options)
    except SamplingError as e:
        param = next((n for n, _, _ in SAMPLING_RULES if str(e).startswith(n + "=")), "seed")
        raise BadRequest(str(e), param, "invalid_value") from None


def parse_stop(stop: Any) -> list[str]:
    """``stop``: absent, a string, or a list of up to ``MAX_STOP`` strings."""
    stops = [stop] if isinstance(stop, str) else (stop or [])
    if not isinstance(stops, list) or len(stops) > MAX_STOP or not all(
            isinstance(s, str) for s in stops):
        raise BadRequest(f"stop={shorten(stop)}: must be a string or a list of up to {MAX_STOP} "
                         "strings", "stop", "invalid_value")
    return stops


def response_schema(response_format: Any) -> dict | bool | None:
    """The JSON schema ``response_format`` asks for, or None for plain text."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    fields = {"text": {"type"}, "json_object": {"type"},
              "json_schema": {"type", "json_schema"}}.get(kind)
    if fields is None:
        raise BadRequest(f"response_format={shorten(response_format)}: must be an object whose "
                         "type is text, json_object or json_schema", "response_format",
                         "invalid_value")
    extra = sorted(set(response_format) - fields)
    if extra:
        raise BadRequest(f"unrecognized request argument supplied: response_format."
                         f"{extra[0]}", "response_format", "unknown_parameter")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise BadRequest(f"response_format.json_schema={shorten(spec)}: must be an object with a "
                         "schema", "response_format", "invalid_value")
    extra = sorted(set(spec) - {"name", "schema", "strict", "description"})
    if extra:
        raise BadRequest(f"unrecognized request argument supplied: response_format."
                         f"json_schema.{extra[0]}", "response_format", "unknown_parameter")
    schema = spec.get("schema", {"type": "object"})
    if not isinstance(schema, (dict, bool)):
        raise BadRequest(f"response_format.json_schema.schema={shorten(schema)}: must be a JSON "
                         "schema (an object or a boolean)", "response_format", "invalid_value")
    return schema


def check_length(chars: int, param: str, model: ModelView) -> None:
    """Refuse text too long for the context whatever its tokens, before tokenizing it."""
    most = (model.context - 1) * model.token_chars
    if chars > most:
        raise BadRequest(f"the {param} is {chars} characters; the context holds "
                         f"{model.context} tokens of at most {model.token_chars} "
                         f"characters each, so it cannot fit", param,
                         "context_length_exceeded")


def completion_prompt(body: dict, model: ModelView) -> list[int]:
    """The token ids of a completion's ``prompt``: a string (tokenized with the BOS/EOS the
    model's tokenizer adds), a list of one string, or token ids within the vocabulary."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        check_length(len(prompt), "prompt", model)
        ids = model.tokenizer.encode(prompt).ids
    elif isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = next((t for t in prompt if not 0 <= t < model.vocab_size), None)
        if bad is not None:
            raise BadRequest(f"prompt token id {bad} is outside the vocabulary "
                             f"(0 .. {model.vocab_size - 1})", "prompt", "invalid_value")
        ids = list(prompt)
    else:
        raise BadRequest(f"prompt={shorten(prompt)}: must be a string, a list of one string, "
                         "or a non-empty list of token ids", "prompt", "invalid_type")
    if not ids:
        raise BadRequest("prompt='': the prompt is empty (it tokenizes to no token)", "prompt",
                         "invalid_value")
    return ids


def chat_prompt(body: dict, model: ModelView) -> list[int]:
    """The token ids of ``messages`` rendered by the model's chat template, every message's
    text kept as text (``ChatTemplate.tokenize``)."""
    if model.template is None:
        raise BadRequest(model.template_error, "messages", "no_chat_template")
    messages = body.get("messages")
    if isinstance(messages, list):
        most = model.context - 1
        if len(messages) > most:  # every message renders to one token at least
            raise BadRequest(f"the conversation has {len(messages)} messages; the context "
                             f"holds {model.context} positions, at least one of them for the "
                             "answer, and each message takes one at least", "messages",
                             "context_length_exceeded")
        messages = [flatten_content(m) for m in messages]
        check_length(sum(len(m["content"]) for m in messages
                         if isinstance(m, dict) and isinstance(m.get("content"), str)),
                     "messages", model)
    try:  # a rendered text longer than this cannot fit the context either
        return model.template.tokenize(messages, model.tokenizer,
                                       max_chars=(model.context - 1) * model.token_chars)
    except ChatError as e:
        raise BadRequest(str(e), "messages", "invalid_value") from None


def flatten_content(message: Any) -> Any:
    """OpenAI's content parts (``[{"type": "text", "text": ...}, ...]``) joined into one
    string; anything else is left for the template's checks."""
    if isinstance(message, dict) and isinstance(message.get("content"), list):
        parts = message["content"]
        if all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
               for p in parts):
            return {**message, "content": "".join(p["text"] for p in parts)}
    return message


def shorten(value: Any, most: int = 60) -> str:
    """``repr(value)`` cut to ``most`` characters, for a message about a possibly huge value."""
    text = repr(value)
    return text if len(text) <= most else text[:most - 3] + "..."
