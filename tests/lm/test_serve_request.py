"""The server's request parsing without a model: every parameter's checks, and each bad value
refused in one line that names the parameter, shows the value and states the rule (with the
parameter, code and status of OpenAI's error object). The model is a ``ModelView`` over a
small word-level tokenizer built here; no bundle is loaded and nothing is built."""

import json

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from iron.errors import IronError
from iron.lm.chat import ChatTemplate
from iron.lm.generate import Sampler
from iron.lm.serve.request import (LLAMA_SERVER_SAMPLING, SAMPLING, BadRequest, ModelView,
                                   parse, parse_body)

WORDS = ["[UNK]", "<|im_start|>", "<|im_end|>", "hello", "world", "user", "assistant", "system",
         "once", "upon", "a", "time"]
CONTEXT = 32
TOKEN_CHARS = max(map(len, WORDS))
#: more characters than the context's tokens can stand for
TOO_LONG = (CONTEXT - 1) * TOKEN_CHARS + 1
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tokenizer() -> Tokenizer:
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return tok


@pytest.fixture(scope="module")
def model() -> ModelView:
    return ModelView("tiny", vocab_size=len(WORDS), context=CONTEXT, tokenizer=tokenizer(),
                     token_chars=TOKEN_CHARS)


@pytest.fixture(scope="module")
def chat_model(model) -> ModelView:
    return ModelView(**{**model.__dict__,
                        "template": ChatTemplate(CHATML, where="chatml.jinja")})


def refused(body, model, chat=False) -> BadRequest:
    """The ``BadRequest`` that parsing ``body`` raises, checked to be one line."""
    with pytest.raises(BadRequest) as caught:
        parse(body, chat, model)
    error = caught.value
    assert isinstance(error, IronError)
    assert error.message and "\n" not in error.message, error.message
    return error


def check(error: BadRequest, param, code, *shown, status=400) -> None:
    """``error`` names ``param`` with ``code`` and ``status``, and its message shows each of
    ``shown`` (the parameter, its value, the rule)."""
    assert (error.param, error.code, error.status) == (param, code, status), error.body()
    for text in shown:
        assert text in error.message, (text, error.message)
    assert error.body() == {"error": {"message": error.message, "type": error.kind,
                                      "param": param, "code": code}}


def ok(**fields) -> dict:
    return {"prompt": "hello world", **fields}


# ---- the body ----------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, shown", [
    (b"{not json", "not valid JSON"),
    (b'{"prompt": "x", "temperature": NaN}', "NaN is not JSON"),
    (b'{"prompt": "a\x01b"}', "not valid JSON"),
    (b"\xff\xfe{}", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply")])
def test_a_body_that_is_not_json_is_refused(model, raw, shown):
    with pytest.raises(BadRequest) as caught:
        parse_body(raw, False, model)
    check(caught.value, None, "invalid_json", shown)
    assert "\n" not in caught.value.message


@pytest.mark.parametrize("body, shown", [([1, 2], "JSON list"), ("hi", "JSON str"),
                                         (None, "JSON NoneType")])
def test_a_body_must_be_an_object(model, body, shown):
    check(refused(body, model), None, None, shown, "must be a JSON object")


@pytest.mark.parametrize("raw, param, shown", [
    (b'{"prompt": "ab\\ud800"}', "prompt", "prompt: character 2 is a lone surrogate (U+D800)"),
    (b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "messages",
     "messages[0].content: character 0 is a lone surrogate (U+DFFF)"),
    (b'{"prompt": "x", "\\ud83d": 1}', None, "key '\\ud83d': character 0")])
def test_a_lone_surrogate_anywhere_is_refused_naming_where(model, raw, param, shown):
    with pytest.raises(BadRequest) as caught:
        parse_body(raw, True, model)
    check(caught.value, param, "invalid_value", shown, "not text")


# ---- parameters known, unknown and not done -------------------------------------------------


@pytest.mark.parametrize("name, chat", [("frobnicate", False), ("cache_prompt", False),
                                        ("messages", False), ("prompt", True), ("echo", True),
                                        ("max_completion_tokens", False)])
def test_an_unknown_parameter_is_named(model, chat_model, name, chat):
    body = {"messages": [{"role": "user", "content": "hi"}]} if chat else ok()
    error = refused({**body, name: 1}, chat_model if chat else model, chat)
    check(error, name, "unknown_parameter", f"unrecognized request argument supplied: {name}")


@pytest.mark.parametrize("name, value", [("logprobs", 2), ("logprobs", True), ("echo", True),
                                         ("suffix", "x"), ("logit_bias", {"3": 1})])
def test_a_parameter_not_done_is_refused(model, name, value):
    check(refused(ok(**{name: value}), model), name, "unsupported", f"{name}={value!r}",
          "not supported")


@pytest.mark.parametrize("name, value", [("tools", [{"type": "function"}]),
                                         ("tool_choice", "auto"), ("top_logprobs", 3),
                                         ("functions", [{}]), ("parallel_tool_calls", True)])
def test_a_chat_parameter_not_done_is_refused(chat_model, name, value):
    body = {"messages": [{"role": "user", "content": "hi"}], name: value}
    check(refused(body, chat_model, chat=True), name, "unsupported", name, "not supported")


def test_parameters_set_to_off_are_accepted(model, chat_model):
    parse(ok(logprobs=False, echo=False, logit_bias={}, suffix=None), False, model)
    parse({"messages": [{"role": "user", "content": "hi"}], "tools": [], "tool_choice": "none",
           "functions": None, "top_logprobs": None}, True, chat_model)


# ---- model, n, best_of ------------------------------------------------------------------------


def test_model(model):
    assert parse(ok(model="tiny"), False, model).prompt == parse(ok(), False, model).prompt
    check(refused(ok(model=5), model), "model", "invalid_type", "model=5", "must be a string")
    check(refused(ok(model="gpt-4"), model), "model", "model_not_found", "'gpt-4'",
          "serves 'tiny'", status=404)


@pytest.mark.parametrize("name", ["n", "best_of"])
def test_n_and_best_of_must_be_1(model, name):
    assert parse(ok(**{name: 1}), False, model) and parse(ok(**{name: None}), False, model)
    check(refused(ok(**{name: 2}), model), name, "unsupported", f"{name}=2",
          f"only {name}=1")
    check(refused(ok(**{name: "2"}), model), name, "invalid_type", f"{name}='2'",
          "must be an integer")
    check(refused(ok(**{name: True}), model), name, "invalid_type", f"{name}=True")


# ---- the prompt and the messages --------------------------------------------------------------


def test_prompt_forms(model):
    ids = [WORDS.index("hello"), WORDS.index("world")]
    assert parse(ok(), False, model).prompt == ids
    assert parse({"prompt": ["hello world"]}, False, model).prompt == ids
    assert parse({"prompt": [3, 4, 0]}, False, model).prompt == [3, 4, 0]


@pytest.mark.parametrize("prompt, code, shown", [
    (None, "invalid_type", "prompt=None"), (5, "invalid_type", "prompt=5"),
    ([], "invalid_type", "prompt=[]"), ([1, True], "invalid_type", "prompt=[1, True]"),
    (["a", "b"], "invalid_type", "prompt=['a', 'b']"),
    ([1, 2.0], "invalid_type", "prompt=[1, 2.0]"),
    ([3, len(WORDS)], "invalid_value", f"token id {len(WORDS)} is outside the vocabulary"),
    ([-1], "invalid_value", "token id -1 is outside the vocabulary"),
    ("", "invalid_value", "prompt=''"),
    ("x" * TOO_LONG, "context_length_exceeded", f"the prompt is {TOO_LONG} characters"),
    ("hello " * CONTEXT, "context_length_exceeded", f"the prompt is {CONTEXT} tokens")])
def test_a_bad_prompt_is_refused(model, prompt, code, shown):
    check(refused({"prompt": prompt}, model), "prompt", code, shown)


def test_a_huge_prompt_value_is_shown_cut(model):
    error = refused({"prompt": [[1]] * 10_000}, model)
    assert len(error.message) < 200 and error.message.startswith("prompt=[[1], [1]")


def test_messages_render_with_the_template(chat_model):
    messages = [{"role": "system", "content": "hello"},
                {"role": "user", "content": [{"type": "text", "text": "once upon "},
                                             {"type": "text", "text": "a time"}]}]
    gen = parse({"messages": messages}, True, chat_model)
    text = chat_model.tokenizer.decode(gen.prompt, skip_special_tokens=False)
    assert text.split() == ["<|im_start|>", "system", "hello", "<|im_end|>", "<|im_start|>",
                            "user", "once", "upon", "a", "time", "<|im_end|>", "<|im_start|>",
                            "assistant"]
    assert gen.max_tokens == CONTEXT - len(gen.prompt)  # a chat may use the whole context


@pytest.mark.parametrize("messages, code, shown", [
    (None, "invalid_value", "messages must be a non-empty list"),
    ([], "invalid_value", "messages must be a non-empty list"),
    (["hi"], "invalid_value", "messages[0] must be an object"),
    ([{"role": "wizard", "content": "hi"}], "invalid_value",
     "messages[0].role='wizard': must be one of system, user, assistant"),
    ([{"role": "user", "content": 5}], "invalid_value",
     "messages[0].content must be a string, got int"),
    ([{"role": "user", "content": "hi"}] * CONTEXT, "context_length_exceeded",
     f"the conversation has {CONTEXT} messages"),
    ([{"role": "user", "content": "x" * TOO_LONG}], "context_length_exceeded",
     f"the messages is {TOO_LONG} characters"),
    ([{"role": "user", "content": "hello " * CONTEXT}], "context_length_exceeded",
     "tokens; the context holds")])
def test_bad_messages_are_refused(chat_model, messages, code, shown):
    check(refused({"messages": messages}, chat_model, chat=True), "messages", code, shown)


def test_a_chat_without_a_template_is_refused(model):
    error = refused({"messages": [{"role": "user", "content": "hi"}]}, model, chat=True)
    check(error, "messages", "no_chat_template", "no chat template")


# ---- max_tokens ---------------------------------------------------------------------------------


def test_max_tokens_defaults(model, chat_model):
    assert parse(ok(), False, model).max_tokens == 16  # OpenAI's legacy completions default
    assert parse({"prompt": [3] * (CONTEXT - 4)}, False, model).max_tokens == 4
    assert parse(ok(max_tokens=None), False, model).max_tokens == 16
    body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3}
    assert parse(body, True, chat_model).max_tokens == 3


@pytest.mark.parametrize("value, code, shown", [
    (0, "invalid_value", "max_tokens=0: must be at least 1"),
    (-5, "invalid_value", "max_tokens=-5: must be at least 1"),
    (1.5, "invalid_type", "max_tokens=1.5: must be an integer"),
    ("8", "invalid_type", "max_tokens='8': must be an integer"),
    (True, "invalid_type", "max_tokens=True: must be an integer"),
    (CONTEXT - 1, "context_length_exceeded",
     f"max_tokens={CONTEXT - 1} does not fit: the prompt is 2 tokens and the context "
     f"{CONTEXT} positions, so at most {CONTEXT - 2}")])
def test_a_bad_max_tokens_is_refused(model, value, code, shown):
    check(refused(ok(max_tokens=value), model), "max_tokens", code, shown)


def test_a_bad_max_completion_tokens_is_named(chat_model):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}
    check(refused(body, chat_model, chat=True), "max_completion_tokens", "invalid_value",
          "max_completion_tokens=0")


# ---- sampling -----------------------------------------------------------------------------------


def test_sampling_takes_the_request_else_the_models_defaults(model):
    sampler = parse(ok(), False, model).sampler
    assert isinstance(sampler, Sampler)
    assert {n: getattr(sampler, n) for n in LLAMA_SERVER_SAMPLING} == LLAMA_SERVER_SAMPLING
    own = ModelView(**{**model.__dict__, "defaults": {**LLAMA_SERVER_SAMPLING, "top_p": 0.5}})
    assert parse(ok(), False, own).sampler.top_p == 0.5
    given = parse(ok(temperature=0, top_k=3, seed=7, presence_penalty=1), False, own).sampler
    assert (given.temperature, given.top_k, given.seed, given.presence_penalty, given.top_p) \
        == (0, 3, 7, 1, 0.5)


OUT_OF_RANGE = {"temperature": (-1, "0 <= temperature <= 100"), "top_p": (0, "0 < top_p <= 1"),
                "top_k": (-3, "top_k is an integer >= 0"), "min_p": (1.5, "0 <= min_p <= 1"),
                "repetition_penalty": (0, "0 < repetition_penalty <= 10"),
                "frequency_penalty": (2.5, "-2 <= frequency_penalty <= 2"),
                "presence_penalty": (-3, "-2 <= presence_penalty <= 2")}


@pytest.mark.parametrize("name", SAMPLING)
def test_a_sampling_value_out_of_range_is_refused(model, name):
    value, rule = OUT_OF_RANGE[name]
    check(refused(ok(**{name: value}), model), name, "invalid_value", f"{name}={value!r}",
          "out of range", rule)


@pytest.mark.parametrize("name", SAMPLING)
def test_a_sampling_value_of_the_wrong_type_is_refused(model, name):
    kind = "an integer" if name == "top_k" else "a number"
    for value in ("hot", True, [1]):
        check(refused(ok(**{name: value}), model), name, "invalid_type", f"{name}={value!r}",
              f"must be {kind}")


def test_top_k_and_seed_must_be_integers(model):
    check(refused(ok(top_k=1.5), model), "top_k", "invalid_type", "top_k=1.5", "an integer")
    check(refused(ok(seed="x"), model), "seed", "invalid_type", "seed='x'", "an integer")
    check(refused(ok(seed=-1), model), "seed", "invalid_value", "seed=-1", "non-negative")


# ---- stop, stream, ignore_eos ------------------------------------------------------------------


def test_stop_forms(model):
    assert parse(ok(stop="x"), False, model).stop == ["x"]
    assert parse(ok(stop=["a", "b", "c", "d"]), False, model).stop == ["a", "b", "c", "d"]
    assert parse(ok(stop=None), False, model).stop == parse(ok(stop=[]), False, model).stop == []


@pytest.mark.parametrize("value", [5, ["a", 1], ["a"] * 5, {"a": 1}])
def test_a_bad_stop_is_refused(model, value):
    check(refused(ok(stop=value), model), "stop", "invalid_value", f"stop={value!r}",
          "a string or a list of up to 4 strings")


def test_stream_and_its_options(model):
    gen = parse(ok(stream=True, stream_options={"include_usage": True}), False, model)
    assert gen.stream and gen.include_usage
    assert not parse(ok(), False, model).stream
    check(refused(ok(stream="yes"), model), "stream", "invalid_type", "stream='yes'",
          "must be true or false")
    check(refused(ok(stream_options=[1]), model), "stream_options", "invalid_type",
          "stream_options=[1]", "must be an object")


def test_ignore_eos(model):
    assert parse(ok(ignore_eos=True), False, model).ignore_eos
    check(refused(ok(ignore_eos=1), model), "ignore_eos", "invalid_type", "ignore_eos=1",
          "must be true or false")
    error = refused(ok(ignore_eos=True, response_format={"type": "json_object"}), model)
    check(error, "ignore_eos", "invalid_value", "ignore_eos=true", "response_format")


# ---- response_format ----------------------------------------------------------------------------


def test_response_format_forms(model):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert parse(ok(), False, model).schema is None
    assert parse(ok(response_format={"type": "text"}), False, model).schema is None
    assert parse(ok(response_format={"type": "json_object"}), False, model).schema == {
        "type": "object"}
    given = {"type": "json_schema", "json_schema": {"name": "a", "strict": True,
                                                    "schema": schema}}
    assert parse(ok(response_format=given), False, model).schema == schema
    bare = {"type": "json_schema", "json_schema": {"name": "a"}}
    assert parse(ok(response_format=bare), False, model).schema == {"type": "object"}


@pytest.mark.parametrize("value, code, shown", [
    ("json", "invalid_value", "response_format='json': must be an object whose type is text"),
    ({"type": "xml"}, "invalid_value", "response_format={'type': 'xml'}"),
    ({"type": "json_object", "strict": True}, "unknown_parameter", "response_format.strict"),
    ({"type": "json_schema"}, "invalid_value", "response_format.json_schema=None"),
    ({"type": "json_schema", "json_schema": {"schema": {}, "x": 1}}, "unknown_parameter",
     "response_format.json_schema.x"),
    ({"type": "json_schema", "json_schema": {"schema": "object"}}, "invalid_value",
     "response_format.json_schema.schema='object': must be a JSON schema")])
def test_a_bad_response_format_is_refused(model, value, code, shown):
    check(refused(ok(response_format=value), model), "response_format", code, shown)


def test_every_message_is_one_line_even_for_a_huge_value(model):
    huge = {"type": "json_schema", "json_schema": {"schema": "s\n" * 100_000}}
    error = refused(ok(response_format=huge), model)
    assert len(error.message) < 300
    assert json.dumps(error.body())  # the error object is plain JSON
