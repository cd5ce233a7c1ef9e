"""The OpenAI-compatible server, driven by the official ``openai`` client over HTTP on
127.0.0.1: streaming and not, several concurrent clients (each gets its tokens alone), stop
strings, bad requests (answered with OpenAI-style errors while the server keeps serving) and a
client that disconnects mid-stream (its slot is freed)."""

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from iron.lm.chat import ChatTemplate  # noqa: E402
from iron.lm.generate import Sampler  # noqa: E402
from iron.lm.serve import Outbox, Server, create_app  # noqa: E402

SLOTS = 4


def call(url: str, body=None, raw: bytes | None = None) -> tuple[int, dict]:
    """(status, JSON reply) of a GET (no body) or a POST of ``body`` as JSON or ``raw``."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def served(smollm2_bundle):
    server = Server(smollm2_bundle, slots=SLOTS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    http = uvicorn.Server(uvicorn.Config(create_app(server), host="127.0.0.1", port=port,
                                         log_level="warning"))
    thread = threading.Thread(target=http.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not http.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield server, f"http://127.0.0.1:{port}"
    http.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[1] + "/v1", api_key="unused", max_retries=0)


def alone(model, ids, n):
    """The greedy tokens of ``ids`` from the one-sequence CLI path, as text."""
    tok = model.tokenizer()
    out, _ = model.generate(ids, n, Sampler())
    return tok.decode([t for t in out if t not in model.eos])


def test_outbox_hands_a_step_over_once_and_waits_until_it_is_taken():
    """What the engine's thread queued during a step reaches the streams' queues, in order, by
    the time ``flush`` returns; from the loop's own thread it is delivered at once."""
    import asyncio

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    outbox, got = Outbox(patience=30), []

    async def setup():
        outbox.bind(asyncio.get_running_loop())
        queues = [asyncio.Queue(), asyncio.Queue()]

        async def reader(q):
            while True:
                got.append(await q.get())
        return queues, [asyncio.ensure_future(reader(q)) for q in queues]

    queues, readers = asyncio.run_coroutine_threadsafe(setup(), loop).result(10)
    for step in range(3):
        for i, q in enumerate(queues):
            outbox.put(q, (step, i))
        outbox.flush()  # no sleep: the readers must have their items already
        assert got == [(s, i) for s in range(step + 1) for i in range(2)]
    outbox.flush()  # nothing queued: returns at once

    async def from_the_loop():
        outbox.put(queues[0], ("loop", 0))
        outbox.flush()
        return queues[0].qsize()

    assert asyncio.run_coroutine_threadsafe(from_the_loop(), loop).result(10) == 1

    async def stop():
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)

    asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_models_and_health(served, client):
    server, url = served
    assert [m.id for m in client.models.list().data] == ["smollm2-135m-instruct"]
    status, health = call(url + "/health")
    assert status == 200 and health["status"] == "ok" and health["slots"] == SLOTS


def test_chat_streams_the_template_rendered_answer(served, client, smollm2_model,
                                                   smollm2):
    server, _ = served
    messages = [{"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "Paris."},
                {"role": "user", "content": "And of Italy?"}]
    stream = client.chat.completions.create(model=server.name, messages=messages, stream=True,
                                            temperature=0, max_tokens=12,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    # the prompt is the checkpoint's template, as transformers renders it
    transformers = pytest.importorskip("transformers")
    rendered = transformers.AutoTokenizer.from_pretrained(smollm2).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
    assert rendered == ChatTemplate.from_dir(smollm2).render(messages)
    ids = server.tokenizer.encode(rendered, add_special_tokens=False).ids
    assert chunks[-1].usage.prompt_tokens == len(ids)
    assert text == alone(smollm2_model, ids, 12) and text


def test_completion_usage_and_length(served, client, smollm2_model):
    server, _ = served
    r = client.completions.create(model=server.name, prompt="The capital of France is",
                                  max_tokens=5, temperature=0)
    ids = server.tokenizer.encode("The capital of France is", add_special_tokens=False).ids
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens <= 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].text == alone(smollm2_model, ids, 5)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_concurrent_streams_each_get_their_tokens_alone(served, client, smollm2_model):
    server, _ = served
    prompts = ["Once upon a time", "The capital of France is", "def fib(n):",
               "Water boils at", "My favourite colour is", "1, 2, 3,"]  # 6 clients, 4 slots
    steps, rows = server.engine.steps, server.engine.batch_rows

    def complete(prompt):
        stream = client.completions.create(model=server.name, prompt=prompt, max_tokens=16,
                                           temperature=0, stream=True)
        return "".join(c.choices[0].text for c in stream if c.choices)

    with ThreadPoolExecutor(len(prompts)) as pool:
        texts = list(pool.map(complete, prompts))
    for prompt, text in zip(prompts, texts):
        ids = server.tokenizer.encode(prompt, add_special_tokens=False).ids
        assert text == alone(smollm2_model, ids, 16), prompt
    steps, rows = server.engine.steps - steps, server.engine.batch_rows - rows
    assert rows / steps > 1.5, f"{rows} sequence-steps in {steps} steps: no batching"


def test_stop_strings_and_penalties(served, client, smollm2_model):
    server, _ = served
    prompt = "Once upon a time"
    full = client.completions.create(model=server.name, prompt=prompt, max_tokens=16,
                                     temperature=0).choices[0].text
    word = full.split()[3]
    cut = client.completions.create(model=server.name, prompt=prompt, max_tokens=16,
                                    temperature=0, stop=[word, "zzz"]).choices[0]
    assert cut.text == full[:full.index(word)] and cut.finish_reason == "stop"
    # a repeated sequence: greedy loops, a penalty makes the model leave the loop
    loop = "la femme au martyre, " * 4
    greedy = client.completions.create(model=server.name, prompt=loop, max_tokens=12,
                                       temperature=0).choices[0].text
    penalised = client.completions.create(model=server.name, prompt=loop, max_tokens=12,
                                          temperature=0, frequency_penalty=2.0,
                                          extra_body={"repetition_penalty": 1.5}
                                          ).choices[0].text
    assert "martyre" in greedy and penalised != greedy


def test_sampling_with_a_seed_repeats(served, client):
    server, _ = served
    texts = [client.completions.create(model=server.name, prompt="Once upon a time",
                                       max_tokens=8, temperature=0.9, top_p=0.95, seed=7,
                                       extra_body={"top_k": 40}).choices[0].text
             for _ in range(2)]
    assert texts[0] == texts[1] and texts[0]


BAD = [
    ({"model": "gpt-4", "prompt": "x"}, 404, "model", "model_not_found"),
    ({"prompt": "x"}, 400, "model", "missing_model"),
    ({"model": "smollm2-135m-instruct", "prompt": "x", "temperature": -1}, 400, "temperature",
     "invalid_value"),
    ({"model": "smollm2-135m-instruct", "prompt": "x", "top_p": 0}, 400, "top_p",
     "invalid_value"),
    ({"model": "smollm2-135m-instruct", "prompt": "x", "top_k": -3}, 400, "top_k",
     "invalid_value"),
    ({"model": "smollm2-135m-instruct", "prompt": "x", "max_tokens": 0}, 400, "max_tokens",
     "invalid_value"),
    ({"model": "smollm2-135m-instruct", "prompt": "x", "max_tokens": 10 ** 6}, 400,
     "max_tokens", "context_length_exceeded"),
    ({"model": "smollm2-135m-instruct", "prompt": "hello " * 3000}, 400, "prompt",
     "context_length_exceeded"),
    ({"model": "smollm2-135m-instruct", "prompt": "x", "n": 2}, 400, "n", "unsupported"),
    ({"model": "smollm2-135m-instruct", "prompt": "x", "stop": 5}, 400, "stop",
     "invalid_value"),
    ({"model": "smollm2-135m-instruct", "prompt": "x", "temperature": "hot"}, 400,
     "temperature", "invalid_type"),
    ({"model": "smollm2-135m-instruct", "prompt": [10 ** 9]}, 400, "prompt", "invalid_value"),
]


@pytest.mark.parametrize("body,status,param,code", BAD, ids=[b[3] + "-" + b[2] for b in BAD])
def test_bad_requests_get_openai_errors(served, body, status, param, code):
    _, url = served
    got, reply = call(url + "/v1/completions", body)
    assert got == status, reply
    error = reply["error"]
    assert (error["param"], error["code"]) == (param, code) and error["message"]


def test_bad_chat_and_json_then_still_serving(served, client):
    server, url = served
    status, reply = call(url + "/v1/chat/completions", raw=b"{not json")
    assert status == 400 and reply["error"]["code"] == "invalid_json"
    status, reply = call(url + "/v1/chat/completions", {
        "model": server.name, "messages": [{"role": "wizard", "content": "hi"}]})
    assert status == 400 and "messages[0].role" in reply["error"]["message"]
    status, reply = call(url + "/v1/nothing")
    assert status == 404 and reply["error"]["code"] == "not_found"
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=server.name, temperature=3000,
                                       messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    r = client.chat.completions.create(model=server.name, max_tokens=3, temperature=0,
                                       messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content and r.usage.completion_tokens <= 3


def test_a_client_that_disconnects_frees_its_slot(served):
    server, url = served
    body = {"model": server.name, "prompt": "Once upon a time", "max_tokens": 1000,
            "temperature": 0, "stream": True}
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("POST", "/v1/completions", json.dumps(body),
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    events = 0
    while events < 3:
        events += response.readline().startswith(b"data: ")
    assert len(server.engine.active) == 1
    connection.close()  # mid-stream, 997 tokens before the end
    deadline = time.monotonic() + 20
    while server.engine.active:
        assert time.monotonic() < deadline, "the slot of a disconnected client was not freed"
        time.sleep(0.05)
    assert len(server.engine.free) == SLOTS
