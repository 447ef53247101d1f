"""`kvlab serve`'s routes called in process (kvlab.server.app's router), the engine thread never started:
every route the router holds is reached, each answering from the app's state (create_app's
ServerContext). A generation request gets as far as the engine's thread would take it: checked and
refused with OpenAI's shapes (a 400 naming its field, a 503 when the waiting queue is full or the server
drains). What the thread then does is tests/test_server.py's, against a really started server."""
import pytest
from fastapi.testclient import TestClient

from kvlab.engine.tokenizer import load_tokenizer
from kvlab.present.fonts import FONT_ROUTE
from kvlab.server.app import ServerContext, create_app, router
from kvlab.serving import ServingConfig, ServingEngine

from helpers import random_model
from serving_helpers import one_thread  # noqa: F401

MODEL = "tiny"


@pytest.fixture
def context(tokenizer_dir):
    """A tiny model's serving engine behind a context whose waiting queue holds none: a request that
    passes every check is refused there, before the engine thread (never started) would take it."""
    tokenizer = load_tokenizer(tokenizer_dir)
    model = random_model(3, vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2)
    engine = ServingEngine(model, ServingConfig(max_num_seqs=2, num_blocks=16, compile=False))
    return ServerContext.build(engine, tokenizer, MODEL, max_waiting=0)


@pytest.fixture
def client(context):
    return TestClient(create_app(context))  # outside `with`: the lifespan, and so the engine thread, never runs


def test_every_route_is_reached_and_answers_from_the_apps_state(client, context):
    reached = set()

    def call(method, path, **options):
        reached.add((method, path))
        return client.request(method, path, **options)

    models = call("GET", "/v1/models").json()
    assert [(model["id"], model["max_model_len"]) for model in models["data"]] == [
        (MODEL, context.limits.max_positions)]
    health = call("GET", "/health")
    assert health.status_code == 503 and health.json() == {"status": "the engine thread is not running"}
    state = call("GET", "/state").json()
    assert (state["model"], state["max_num_seqs"], state["max_waiting"]) == (MODEL, 2, 0)
    page = call("GET", "/")
    assert page.status_code == 200 and MODEL in page.text
    font = call("GET", FONT_ROUTE)
    assert font.headers["content-type"] == "font/ttf" and len(font.content) > 1_000_000

    # a request every check lets through, refused at the full waiting queue: a 503 to retry
    for path, body in (("/v1/completions", {"model": MODEL, "prompt": "민수는", "max_tokens": 4}),
                       ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "안녕"}],
                                                 "max_tokens": 4})):
        refused = call("POST", path, json=body)
        assert refused.status_code == 503 and refused.headers["Retry-After"] == str(context.retry_after_s)
        assert refused.json()["error"]["code"] == "overloaded", refused.json()
    metrics = call("GET", "/metrics")
    assert metrics.status_code == 200 and 'reason="overloaded"' in metrics.text, metrics.text

    routes = {(method, route.path) for route in router.routes for method in route.methods - {"HEAD"}}
    assert reached == routes, routes - reached


def test_a_bad_request_is_a_400_naming_its_field_and_an_unknown_path_a_404(client):
    bad = client.post("/v1/completions", json={"model": MODEL, "prompt": "민수는", "temperature": -1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "temperature", bad.json()
    wrong_model = client.post("/v1/completions", json={"model": "other", "prompt": "민수는"})
    assert wrong_model.status_code == 400 and wrong_model.json()["error"]["code"] == "model_not_found"
    missing = client.get("/v1/nowhere")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_a_draining_server_refuses_new_requests_and_says_so(client, context):
    context.thread.drain(0)
    health = client.get("/health")
    assert health.status_code == 503 and health.json() == {"status": "shutting down"}
    refused = client.post("/v1/completions", json={"model": MODEL, "prompt": "민수는", "max_tokens": 4})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
