"""`kvlab serve` driven by real clients: the official `openai` client (completions and chat, streamed and
not, n > 1) gets the in-process engine's tokens for the same request and seed; a client that leaves
mid-answer frees its request and blocks at once; a full waiting queue answers 503 with Retry-After;
each bad request a 400 naming its field; SIGTERM ends the running requests within the drain and exits 0.

The server is a real subprocess on a free loopback port (`python -m kvlab.server`, this checkout's
package), shared by the module: a tiny random MiniMind saved as a checkpoint, the tests' tokenizer, two
slots, a waiting queue of one, a drain of 0.2 s. The SIGTERM test, the last, stops it."""
import asyncio
import json
import signal
import time

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from kvlab.checkpoints import inspect_checkpoint, load_inspected
from kvlab.engine.checkpoint import save_checkpoint
from kvlab.engine.tokenizer import load_tokenizer
from kvlab.measure.serving_bench import ServerProcess
from kvlab.server.detokenize import IncrementalText
from kvlab.server.serving_thread import Finished, ServingThread
from kvlab.server.metrics import ServerMetrics
from kvlab.serving import SamplingParams, ServingConfig, ServingEngine

from helpers import assert_hangul_drawn_in_the_pages_own_face, chromium_and_playwright, random_model
from serving_helpers import one_thread  # noqa: F401

# a drain well under the LONG request's time (900 tokens of this model: about 1 s on this VM)
DRAIN = 0.2
SLOTS, WAITING, BLOCKS = 2, 1, 64  # the shared server: ServingConfig(max_num_seqs=2, num_blocks=64), --max-waiting 1
SERVER_ARGS = ["--max-num-seqs", SLOTS, "--num-blocks", BLOCKS, "--max-waiting", WAITING, "--threads", 1,
               "--drain-seconds", DRAIN]
MODEL = "tiny"
LONG = {"max_tokens": 900, "ignore_eos": True}  # runs for about a second: still running when the test acts


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer_dir):
    folder = tmp_path_factory.mktemp("served")
    vocab = load_tokenizer(tokenizer_dir).vocab_size
    save_checkpoint(random_model(3, vocab_size=vocab, hidden_size=64, num_hidden_layers=2), folder / "tiny.pth")
    return folder / "tiny.pth"


class Servers:
    """The module's server, started once; the SIGTERM test (the module's last) stops it, and a test that
    ran after it would find a new one started."""

    def __init__(self, args):
        self.args = args
        self.current = None

    def get(self) -> ServerProcess:
        if self.current is None or self.current.process.poll() is not None:
            if self.current is not None:
                self.current.folder.cleanup()
            self.current = ServerProcess(self.args).start().wait_ready()
        return self.current


@pytest.fixture(scope="module")
def servers(checkpoint, tokenizer_dir):
    servers = Servers(["--checkpoint", checkpoint, "--tokenizer", tokenizer_dir, "--served-model-name", MODEL,
                       *SERVER_ARGS])
    yield servers
    if servers.current is not None:
        servers.current.kill()
        servers.current.folder.cleanup()


@pytest.fixture
def server(servers):
    return servers.get()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


@pytest.fixture(scope="module")
def in_process(checkpoint, tokenizer):
    """The same checkpoint loaded as the server loads it, served in process with the server's config."""
    inspection = inspect_checkpoint(checkpoint, "sft", {}, tokenizer, None)
    model, _ = load_inspected(checkpoint, inspection, "cpu", "float32")

    def serve(prompt, **knobs):
        engine = ServingEngine(model, ServingConfig(max_num_seqs=SLOTS, num_blocks=BLOCKS))
        engine.add_request(prompt, SamplingParams(eos_token_id=tokenizer.eos_id, **knobs))
        return engine.run().outputs[0].samples

    return serve


def metrics(server) -> dict:
    """GET /metrics as {name (as exposed, e.g. vllm:generation_tokens_total): value}, labels dropped
    but finished_reason's."""
    text = httpx.get(f"{server.url}/metrics").text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            reason = sample.labels.get("finished_reason")
            values[sample.name + (f"/{reason}" if reason else "")] = sample.value
    return values


def wait_for(condition, seconds=15.0, what="the condition"):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} did not hold within {seconds} s")


def idle(server) -> bool:
    found = metrics(server)
    return (found["vllm:num_requests_running"] == 0 and found["vllm:num_requests_waiting"] == 0
            and found["kvlab:kv_blocks_free"] == BLOCKS and found["kvlab:kv_blocks_used"] == 0)


# --- the openai client gets the in-process engine's tokens -------------------------------------------

def test_completions_equal_the_in_process_engine_streamed_and_not(client, in_process, tokenizer):
    prompt = "민수는 아침에"
    ids = tokenizer.encode(prompt)
    expected = in_process(ids, max_tokens=12, seed=11, n=2)
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, seed=11, n=2,
                                      extra_body={"return_token_ids": True})
    assert [choice.token_ids for choice in whole.choices] == expected
    assert [choice.text for choice in whole.choices] == [tokenizer.decode(s, skip_special_tokens=True)
                                                          for s in expected]
    assert whole.usage.prompt_tokens == len(ids) and whole.usage.completion_tokens == sum(map(len, expected))
    assert whole.model_extra["prompt_token_ids"] == ids

    texts, tokens, reasons, usage = ["", ""], [[], []], [None, None], None
    for chunk in client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, seed=11, n=2, stream=True,
                                           stream_options={"include_usage": True},
                                           extra_body={"return_token_ids": True}):
        if chunk.usage is not None:
            assert chunk.choices == [] and usage is None
            usage = chunk.usage
        for choice in chunk.choices:
            assert reasons[choice.index] is None, "a chunk after the sample's last"
            texts[choice.index] += choice.text
            tokens[choice.index] += choice.token_ids
            reasons[choice.index] = choice.finish_reason
    assert tokens == expected and texts == [choice.text for choice in whole.choices]
    assert reasons == [choice.finish_reason for choice in whole.choices] and set(reasons) <= {"stop", "length"}
    assert usage == whole.usage


def test_greedy_and_token_id_prompts_equal_the_in_process_engine(client, in_process, tokenizer):
    ids = [tokenizer.bos_id] + tokenizer.encode("가람 마을의 특산물은")
    expected = in_process(ids, max_tokens=10, do_sample=False, temperature=1.0)
    answer = client.completions.create(model=MODEL, prompt=ids, max_tokens=10, temperature=0,
                                       extra_body={"return_token_ids": True})
    assert answer.choices[0].token_ids == expected[0]


def test_chat_equals_the_in_process_engine_on_the_chat_template(client, in_process, tokenizer):
    messages = [{"role": "system", "content": "짧게 답하세요."}, {"role": "user", "content": "가람 마을의 특산물은?"}]
    prompt = tokenizer.encode(tokenizer.chat_text(messages, add_generation_prompt=True))
    expected = in_process(prompt, max_tokens=9, seed=5, temperature=1.2, top_p=0.95, top_k=0)
    knobs = dict(model=MODEL, messages=messages, max_tokens=9, seed=5, temperature=1.2, top_p=0.95,
                 extra_body={"top_k": 0, "return_token_ids": True})
    whole = client.chat.completions.create(**knobs)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.choices[0].token_ids == expected[0] and whole.usage.prompt_tokens == len(prompt)
    assert whole.choices[0].message.content == tokenizer.decode(expected[0], skip_special_tokens=True)

    chunks = list(client.chat.completions.create(**knobs, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == len(expected[0])  # usage in the last chunk by default


def test_models_health_and_metrics_in_prometheus_format(client, server):
    assert [model.id for model in client.models.list()] == [MODEL]
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    before = metrics(server)
    client.completions.create(model=MODEL, prompt="지우는", max_tokens=4, seed=1, extra_body={"ignore_eos": True})
    after = metrics(server)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 4
    assert after["vllm:request_success_total/length"] - before.get("vllm:request_success_total/length", 0) == 1
    assert after["vllm:time_to_first_token_seconds_count"] == before["vllm:time_to_first_token_seconds_count"] + 1
    assert after["vllm:inter_token_latency_seconds_count"] == before["vllm:inter_token_latency_seconds_count"] + 3
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "kvlab:kv_blocks_used",
                 "vllm:kv_cache_usage_perc", "vllm:request_time_per_output_token_seconds_count",
                 "vllm:e2e_request_latency_seconds_count"):
        assert name in after, name
    assert after["kvlab:kv_blocks_free"] == BLOCKS


def test_a_sample_that_ends_at_eos_is_counted_as_stop_as_the_docs_say(checkpoint, tokenizer):
    """The engine ends a sample at "eos"; OpenAI's answers and the metrics' finished_reason call it "stop"
    (docs/serving.md: stop, length, abort). The sample is made to end there: the prompt's greedy first
    token is given as its eos."""
    inspection = inspect_checkpoint(checkpoint, "sft", {}, tokenizer, None)
    model, _ = load_inspected(checkpoint, inspection, "cpu", "float32")
    prompt = tokenizer.encode("민수는")
    engine = ServingEngine(model, ServingConfig(max_num_seqs=SLOTS, num_blocks=BLOCKS, compile=False))
    engine.add_request(prompt, SamplingParams(do_sample=False, max_tokens=1, eos_token_id=None))
    first = engine.run().outputs[0].samples[0][0]
    metrics = ServerMetrics(MODEL)
    thread = ServingThread(ServingEngine(model, ServingConfig(max_num_seqs=SLOTS, num_blocks=BLOCKS, compile=False)),
                           metrics, max_waiting=1)

    async def ask():
        stream = thread.submit(prompt, SamplingParams(do_sample=False, max_tokens=8, eos_token_id=first))
        return [event async for event in stream.events()][-1]

    thread.start()
    try:
        finished = asyncio.run(ask())
    finally:
        thread.stop()
    assert isinstance(finished, Finished) and finished.reasons == ("eos",)
    text = metrics.exposition().decode()
    assert 'finished_reason="stop"' in text and 'finished_reason="eos"' not in text, text


# --- never stuck, never leaking ----------------------------------------------------------------------

def test_a_client_that_disconnects_mid_stream_frees_its_request_and_blocks(server):
    before = metrics(server)
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=30,
                      json={"model": MODEL, "prompt": "민수는", "stream": True, **LONG}) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # a token came
        held = metrics(server)
        assert held["vllm:num_requests_running"] == 1 and held["kvlab:kv_blocks_used"] > 0
    # the connection is closed here, hundreds of tokens before max_tokens
    wait_for(lambda: idle(server), what="0 running and every block free after the disconnect")
    after = metrics(server)
    assert after["vllm:request_success_total/abort"] - before.get("vllm:request_success_total/abort", 0) == 1
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < LONG["max_tokens"]


def test_a_client_that_gives_up_on_a_whole_answer_frees_it_too(server):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", timeout=0.5, json={"model": MODEL, "prompt": "지우는", **LONG})
    wait_for(lambda: idle(server), what="0 running and every block free after the client's timeout")


def test_a_full_waiting_queue_answers_503_with_retry_after(server):
    """Two slots running, one request waiting (--max-waiting 1): the next is refused at once."""
    async def overload():
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            body = {"model": MODEL, "prompt": "민수는", "stream": True, **LONG}
            streams = []
            for expected_running in (1, 2):
                streams.append(await http.send(http.build_request("POST", "/v1/completions", json=body), stream=True))
                await asyncio.to_thread(wait_for, lambda: metrics(server)["vllm:num_requests_running"] == expected_running)
            streams.append(await http.send(http.build_request("POST", "/v1/completions", json=body), stream=True))
            await asyncio.to_thread(wait_for, lambda: metrics(server)["vllm:num_requests_waiting"] == 1)
            refused = await http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 4,
                                                                     "messages": [{"role": "user", "content": "안녕"}]})
            for stream in streams:
                await stream.aclose()
            return refused

    refused = asyncio.run(overload())
    assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["code"] == "overloaded"
    wait_for(lambda: idle(server), what="the overload's requests freed once their clients left")
    assert metrics(server)["kvlab:requests_rejected_total"] >= 1


BAD_REQUESTS = [
    ("completions", {"prompt": [5] * (BLOCKS * 16 + 1)}, "prompt"),  # longer than the pool holds
    ("completions", {"prompt": [5, 10**6]}, "prompt"),  # not a token id of the model's
    ("completions", {"prompt": ""}, "prompt"),
    ("completions", {"prompt": 7}, "prompt"),
    ("completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("completions", {"prompt": [5], "max_tokens": BLOCKS * 16 + 1}, "max_tokens"),  # the pool again
    ("completions", {"prompt": "x", "temperature": -0.5}, "temperature"),
    ("completions", {"prompt": "x", "top_p": 0}, "top_p"),
    ("completions", {"prompt": "x", "n": SLOTS + 1}, "n"),
    ("completions", {"prompt": "x", "seed": "one"}, "seed"),
    ("completions", {"prompt": "x", "stop": ["\n"]}, "stop"),
    ("completions", {"prompt": "x", "model": "gpt-4o"}, "model"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1},
     "max_completion_tokens"),
    ("chat/completions", {"messages": [{"content": "x"}]}, "messages[0].role"),
    ("chat/completions", {"prompt": "x"}, "messages"),
]


@pytest.mark.parametrize("endpoint, body, param", BAD_REQUESTS, ids=[f"{e}-{p}" for e, _, p in BAD_REQUESTS])
def test_each_bad_request_is_a_400_naming_its_field(server, endpoint, body, param):
    response = httpx.post(f"{server.url}/v1/{endpoint}", json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{param}: ")


def test_malformed_json_is_a_400_in_openais_shape(server):
    for content in (b'{"prompt": "x", ', b"[1, 2]", b""):
        response = httpx.post(f"{server.url}/v1/completions", content=content,
                              headers={"Content-Type": "application/json"})
        assert response.status_code == 400, content
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert "JSON" in httpx.post(f"{server.url}/v1/completions", content=b"{",
                                headers={"Content-Type": "application/json"}).json()["error"]["message"]
    # where decoding stopped, and why: the stray comma is at character 15
    message = httpx.post(f"{server.url}/v1/completions", content=b'{"prompt": "x",, "max_tokens": 2}',
                         headers={"Content-Type": "application/json"}).json()["error"]["message"]
    assert message.startswith("the body is not valid JSON at character 15: ") and "double quotes" in message, message


def test_the_openai_client_raises_the_400_with_its_field(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt="x", temperature=-1)
    assert refused.value.status_code == 400 and refused.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as unknown:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert unknown.value.body["param"] == "model"


# --- text as it streams ------------------------------------------------------------------------------

def byte_tokens(tokenizer, text: str) -> list[int]:
    """`text` as one token per UTF-8 byte (byte-level BPE's alphabet: GPT-2's byte-to-character map)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    ids = [tokenizer._tok.token_to_id(chars[byte]) for byte in text.encode("utf-8")]
    assert None not in ids
    return ids


def test_streamed_text_never_cuts_a_hangul_syllable(tokenizer):
    text = "가람 마을의 특산물은 배입니다."
    pieces, stream = [], IncrementalText(tokenizer)
    for token in byte_tokens(tokenizer, text):
        pieces.append(stream.add([token]))
    pieces.append(stream.flush())
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)
    assert sum(piece == "" for piece in pieces) >= 2 * sum("가" <= char <= "힣" for char in text)  # held back
    cut = IncrementalText(tokenizer)
    assert cut.add(byte_tokens(tokenizer, "가")[:2]) == "" and cut.flush() == "\ufffd"  # the end stays as it decodes


def test_streamed_pieces_add_up_to_the_whole_text_of_any_tokens(tokenizer):
    """Drawn token sequences (invalid bytes, special tokens and all), one token at a time."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        ids = torch.randint(0, tokenizer.vocab_size, (int(torch.randint(1, 40, (1,), generator=generator)),),
                            generator=generator).tolist()
        stream = IncrementalText(tokenizer)
        pieces = [stream.add([token]) for token in ids] + [stream.flush()]
        assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True), ids


# --- the page at / ----------------------------------------------------------------------------------

def test_the_page_streams_an_answer_and_shows_the_engines_state_in_a_browser(server):
    """Chromium (Debian's) driven by Playwright: the page shows a long request running and its blocks,
    then answers its own prompt, streamed, with the knobs set in the form."""
    import threading

    executable, sync_playwright = chromium_and_playwright("the page")
    started, leave = threading.Event(), threading.Event()

    def long_request():
        with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                          json={"model": MODEL, "prompt": "민수는", "stream": True, **LONG}) as response:
            lines = response.iter_lines()  # held: a closed line iterator would close the connection
            next(line for line in lines if line.startswith("data: "))
            started.set()
            leave.wait(30)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        worker = threading.Thread(target=long_request)
        try:
            page = browser.new_page()
            page.goto(server.url)
            page.wait_for_function(f"document.getElementById('num_blocks').textContent === '{BLOCKS}'")
            worker.start()
            assert started.wait(30)
            page.wait_for_function("document.getElementById('running').textContent === '1'")
            assert page.locator("#blocks span.used").count() > 0
            leave.set()
            worker.join(30)
            page.wait_for_function("document.getElementById('running').textContent === '0'")
            page.fill("#prompt", "가람 마을의 특산물은?")
            page.fill("#temperature", "0")
            page.fill("#max_tokens", "6")
            page.click("#send")
            page.wait_for_function("document.getElementById('answer').dataset.finish !== undefined")
            assert page.locator("#answer").get_attribute("data-finish") in ("stop", "length")
            assert "answer" in page.locator("#usage").inner_text()
            page_text = page.evaluate("document.getElementById('answer').textContent")
            # an answer in Hangul (as the stream writes one) is drawn in the face the server serves
            # (GET /fonts/NanumGothic.ttf), not in the machine's
            page.evaluate("document.getElementById('answer').textContent = '가람 마을의 특산물은 복숭아입니다.'")
            assert_hangul_drawn_in_the_pages_own_face(page, "#answer")
        finally:
            leave.set()
            browser.close()
    # the page's answer is the greedy one the API gives
    greedy = httpx.post(f"{server.url}/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "가람 마을의 특산물은?"}], "temperature": 0,
        "max_tokens": 6}).json()["choices"][0]["message"]["content"]
    assert page_text == greedy


def test_a_second_start_loads_the_step_the_first_compiled(checkpoint, tokenizer_dir, tmp_path):
    """`kvlab serve` makes its step ready before it answers: the first start on an empty cache compiles
    it and keeps it there, a second start loads it (compiling nothing) and answers the same tokens."""
    import os

    env = {**os.environ, "KVLAB_CACHE_DIR": str(tmp_path / "cache")}
    args = ["--checkpoint", checkpoint, "--tokenizer", tokenizer_dir, "--served-model-name", MODEL, *SERVER_ARGS]
    answers, logs = [], []
    for _ in range(2):
        with ServerProcess(args, env=env) as started:
            answers.append(httpx.post(f"{started.url}/v1/completions", timeout=60, json={
                "model": MODEL, "prompt": "민수는", "temperature": 0, "max_tokens": 8}).json()["choices"][0]["text"])
            logs.append(started.log_tail(200))
    assert "the engine's step compiled into" in logs[0] and "loaded from" not in logs[0], logs[0]
    assert "the engine's step loaded from" in logs[1] and "compiled into" not in logs[1], logs[1]
    assert answers[0] == answers[1]
    assert list((tmp_path / "cache" / "aot").glob("*.pt2"))


def test_a_cache_in_int8_serves_what_generate_gives_with_its_cache_in_int8(checkpoint, tokenizer_dir, tokenizer):
    """`kvlab serve --kv-dtype int8`: the pool's blocks store int8, served the eager way (the log says so),
    and a greedy answer's tokens are `generate`'s with its cache in int8."""
    from kvlab.serving import generate_alone

    ids = [tokenizer.bos_id] + tokenizer.encode("가람 마을의 특산물은")
    args = ["--checkpoint", checkpoint, "--tokenizer", tokenizer_dir, "--served-model-name", MODEL, *SERVER_ARGS,
            "--kv-dtype", "int8"]
    with ServerProcess(args) as started:
        client = openai.OpenAI(base_url=f"{started.url}/v1", api_key="unused", max_retries=0, timeout=60)
        answer = client.completions.create(model=MODEL, prompt=ids, max_tokens=24, temperature=0,
                                           extra_body={"return_token_ids": True})
        log = started.log_tail(200)
    model, _ = load_inspected(checkpoint, inspect_checkpoint(checkpoint, "sft", {}, tokenizer, None), "cpu", "float32")
    params = SamplingParams(max_tokens=24, eos_token_id=tokenizer.eos_id, do_sample=False, temperature=1.0)
    assert answer.choices[0].token_ids == generate_alone(model, ids, params, kv_dtype="int8")[0]
    assert "--kv-dtype int8: served the eager way" in log, log


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_stops_at_once_whatever_the_drain(checkpoint, tokenizer_dir, second):
    """With a drain of a minute and some twelve seconds of requests queued, a first SIGTERM starts the
    drain and a second SIGTERM or Ctrl+C (SIGINT) ends the process within seconds: the requests are
    aborted, no traceback is logged, the exit status is 0."""
    import threading

    args = ["--checkpoint", checkpoint, "--tokenizer", tokenizer_dir, "--served-model-name", MODEL, "--threads", 1,
            "--max-num-seqs", 1, "--max-waiting", 16, "--drain-seconds", 60]
    streaming = threading.Event()

    def consume(url):
        try:
            with httpx.stream("POST", f"{url}/v1/completions", timeout=120,
                              json={"model": MODEL, "prompt": "민수는", "stream": True, **LONG}) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        streaming.set()
        except httpx.HTTPError:
            pass  # the server went away: what this test is about

    with ServerProcess(args) as started:
        clients = [threading.Thread(target=consume, args=(started.url,), daemon=True) for _ in range(12)]
        for client_thread in clients:
            client_thread.start()
        assert streaming.wait(30)
        started.process.terminate()
        wait_for(lambda: httpx.get(f"{started.url}/health").status_code == 503, what="the drain")
        sent = time.monotonic()
        started.process.send_signal(second)
        started.process.wait(30)
        stopped = time.monotonic() - sent
        log = started.log_tail(400)
    assert stopped < 5, f"stopped {stopped:.1f} s after the second signal (12 requests of about 1 s queued)"
    assert started.process.returncode == 0, log
    assert "Traceback" not in log and "CancelledError" not in log, log


# --- last: it stops the module's server ------------------------------------------------------------

def test_sigterm_ends_the_running_requests_within_the_drain_and_exits_0(server):
    """During the drain the listener stays open: /health and a new request get a 503 with Retry-After (not
    a refused connection); the running request is ended by the drain; then the process exits 0."""
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                      json={"model": MODEL, "prompt": "민수는", "stream": True, **LONG}) as response, \
            httpx.Client(base_url=server.url, timeout=10) as http:
        assert response.status_code == 200
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        assert http.get("/health").status_code == 200
        server.process.terminate()
        sent = time.monotonic()
        health = http.get("/health")
        while health.status_code == 200 and time.monotonic() - sent < 10:  # until the server has the signal
            health = http.get("/health")
        refused = http.post("/v1/completions", json={"model": MODEL, "prompt": "지우는", "max_tokens": 2})
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        ended = time.monotonic() - sent
    assert health.status_code == 503 and health.json() == {"status": "shutting down"}
    assert health.headers["Retry-After"] == "1"
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
    assert refused.json()["error"]["code"] == "shutting_down"
    reasons = [choice["finish_reason"] for chunk in chunks for choice in chunk["choices"] if choice["finish_reason"]]
    assert reasons == ["abort"], "the running request is ended by the drain, not by max_tokens"
    assert chunks[-1]["usage"]["completion_tokens"] < LONG["max_tokens"]
    assert ended < DRAIN + 10, f"the stream ended {ended:.1f} s after SIGTERM (--drain-seconds {DRAIN})"
    server.process.wait(30)
    assert server.process.returncode == 0, server.log_tail()
    assert time.monotonic() - sent < 30
