"""The HTTP side: FastAPI routes that check a request, hand it to the serving thread and answer in
OpenAI's shapes, streamed as server-sent events or whole.

  POST /v1/completions        a prompt (text, or token ids) continued
  POST /v1/chat/completions   messages rendered with the tokenizer's chat template, the assistant's answer
  GET  /v1/models             the one model served
  GET  /health                200 while serving; 503 while draining (with Retry-After) or once the engine thread died
  GET  /metrics               Prometheus' text format (kvlab.server.metrics)
  GET  /state                 the engine's live state as JSON (what the page at / draws)
  GET  /                      a page to watch it: a prompt, its tokens streaming, the engine's queues and blocks
  GET  /fonts/NanumGothic.ttf the page's Hangul font (the package's NanumGothic), for a machine without one

The routes live at module level on `router`; each reads what it shares with the others (the tokenizer,
the limits, the engine, its thread, the metrics: a ServerContext) from `request.app.state.context`,
which `create_app` sets before it includes the router.

A streamed answer is one `data: {chunk}` event per draw that adds text (per sample, `index` the
sample), then for each sample a chunk with its `finish_reason`, then (unless `stream_options:
{"include_usage": false}`) one chunk with no choices and the `usage`, then `data: [DONE]`. A client
that disconnects, streaming or not, has its request aborted and its blocks freed before the next step.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from kvlab.engine.tokenizer import Tokenizer
from kvlab.present.fonts import FONT_ROUTE, web_font
from kvlab.serving import SamplingParams, ServingEngine
from kvlab.server import page, protocol
from kvlab.server.detokenize import IncrementalText
from kvlab.server.serving_thread import Failed, Finished, Overloaded, RequestStream, ServingThread, ShuttingDown, Tokens
from kvlab.server.metrics import CONTENT_TYPE, ServerMetrics
from kvlab.server.protocol import ApiError, ChatRequest, CompletionRequest, Limits, Shape


@dataclass
class ServerContext:
    """Everything the routes share: the tokenizer, what the model and pool hold, the serving thread."""

    tokenizer: Tokenizer
    limits: Limits
    engine: ServingEngine
    thread: ServingThread
    metrics: ServerMetrics
    retry_after_s: int = 1

    @classmethod
    def build(cls, engine: ServingEngine, tokenizer: Tokenizer, model_name: str, max_waiting: int) -> "ServerContext":
        model = engine.model.config
        limits = Limits(model_name, model.vocab_size, model.max_position_embeddings, tokenizer.eos_id, engine.config)
        metrics = ServerMetrics(model_name)
        return cls(tokenizer, limits, engine, ServingThread(engine, metrics, max_waiting), metrics)


# Characters a JSON string may hold raw that some clients' line splitting (str.splitlines) takes for a
# line end, inside an event: written escaped. (SSE itself ends lines only at CR and LF, which JSON escapes.)
LINE_BREAKING = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}


def sse(payload: dict | str) -> str:
    """One server-sent event: `data: ` and the payload (JSON, UTF-8 as is, Hangul readable)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    for char, escaped in LINE_BREAKING.items():
        data = data.replace(char, escaped)
    return f"data: {data}\n\n"


router = APIRouter()


def context_of(request: Request) -> ServerContext:
    """What the routes share, as create_app put it in the app's state."""
    return request.app.state.context


@asynccontextmanager
async def lifespan(app: FastAPI):
    """The engine's thread runs while the app serves."""
    thread = app.state.context.thread
    thread.start()
    yield
    thread.stop()


async def api_error(request: Request, err: ApiError):
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def invalid(request: Request, err: RequestValidationError):
    error = protocol.validation_error(err.errors())
    return JSONResponse(error.body(), status_code=error.status)


async def http_error(request: Request, err: HTTPException):
    kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
    return JSONResponse(ApiError(err.status_code, f"{request.method} {request.url.path}: {err.detail}",
                                 kind=kind).body(), status_code=err.status_code)


# --- the two generation endpoints ------------------------------------------------------------------

@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    context = context_of(request)
    limits = context.limits
    protocol.check_model(body, limits)
    protocol.check_implemented(body)
    prompt = protocol.completion_prompt(body, context.tokenizer.encode)
    params = protocol.sampling_params(body, prompt, limits, body.max_tokens)
    return await answer(context, request, body, prompt, params, Shape.of(False, limits.model_name))


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatRequest, request: Request):
    context = context_of(request)
    limits = context.limits
    protocol.check_model(body, limits)
    protocol.check_implemented(body)
    prompt = protocol.chat_prompt(body, context.tokenizer)
    params = protocol.sampling_params(body, prompt, limits, body.max_completion_tokens or body.max_tokens)
    return await answer(context, request, body, prompt, params, Shape.of(True, limits.model_name))


def submit(context: ServerContext, prompt: list[int], params: SamplingParams) -> RequestStream:
    try:
        context.engine.check_request(prompt, params)  # reads only the configs: safe off the engine thread
    except ValueError as err:
        raise ApiError(400, str(err)) from None
    try:
        return context.thread.submit(prompt, params)
    except Overloaded:
        context.metrics.reject("overloaded")
        raise ApiError(503, f"overloaded: {context.thread.max_waiting} requests wait already (--max-waiting); "
                       "retry later", kind="server_error", code="overloaded",
                       headers={"Retry-After": str(context.retry_after_s)}) from None
    except ShuttingDown:
        context.metrics.reject("shutdown")
        raise ApiError(503, "the server is shutting down", kind="server_error", code="shutting_down",
                       headers={"Retry-After": str(context.retry_after_s)}) from None


async def answer(context: ServerContext, request: Request, body, prompt: list[int], params: SamplingParams,
                 shape: Shape):
    stream = submit(context, prompt, params)
    if body.stream:
        return StreamingResponse(streamed(context, stream, body, shape), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    collecting = asyncio.ensure_future(collect(stream))
    leaving = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({collecting, leaving}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        leaving.cancel()
        if not collecting.done():  # the client left (or the handler was cancelled): free its blocks
            collecting.cancel()
            context.thread.abort(stream)
    if not collecting.done() or collecting.cancelled():
        return Response(status_code=499)  # nobody reads it
    rows, finished = collecting.result()
    choices = [shape.choice(index, context.tokenizer.decode(ids, skip_special_tokens=True),
                            protocol.FINISH_REASONS[reason], ids if body.return_token_ids else None, stream=False)
               for index, (ids, reason) in enumerate(zip(rows, finished.reasons))]
    return shape.response(choices, protocol.usage(finished.prompt_tokens, finished.completion_tokens),
                          prompt if body.return_token_ids else None)


async def collect(stream: RequestStream):
    rows = [[] for _ in range(stream.params.n)]
    async for event in stream.events():
        if isinstance(event, Tokens):
            for row, ids in zip(rows, event.rows):
                row += ids
        elif isinstance(event, Finished):
            return rows, event
        else:
            raise ApiError(event.status, event.message, kind="server_error")


async def disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def streamed(context: ServerContext, stream: RequestStream, body, shape: Shape):
    n, with_ids = stream.params.n, body.return_token_ids
    texts = [IncrementalText(context.tokenizer) for _ in range(n)]
    try:
        if shape.chat:
            for index in range(n):
                yield sse(shape.chunk([shape.choice(index, "", None, None, stream=True, role=True)]))
        async for event in stream.events():
            if isinstance(event, Tokens):
                for index, ids in enumerate(event.rows):
                    text = texts[index].add(list(ids)) if ids else ""
                    if text or (ids and with_ids):
                        yield sse(shape.chunk([shape.choice(index, text, None, list(ids) if with_ids else None,
                                                            stream=True)]))
            elif isinstance(event, Finished):
                for index, reason in enumerate(event.reasons):
                    yield sse(shape.chunk([shape.choice(index, texts[index].flush(),
                                                        protocol.FINISH_REASONS[reason],
                                                        [] if with_ids else None, stream=True)]))
                if body.include_usage:
                    yield sse(shape.chunk([], protocol.usage(event.prompt_tokens, event.completion_tokens)))
            elif isinstance(event, Failed):
                yield sse(ApiError(event.status, event.message, kind="server_error").body())
        yield sse("[DONE]")
    finally:  # the client left mid-stream (the generator is closed or cancelled): free its blocks now
        if not stream.closed:
            context.thread.abort(stream)


# --- the rest --------------------------------------------------------------------------------------

@router.get("/v1/models")
async def models(request: Request):
    limits = context_of(request).limits
    return {"object": "list", "data": [{"id": limits.model_name, "object": "model", "created": 0,
                                        "owned_by": "kvlab", "max_model_len": limits.max_positions}]}


@router.get("/health")
async def health(request: Request):
    context = context_of(request)
    if context.thread.draining:
        return JSONResponse({"status": "shutting down"}, status_code=503,
                            headers={"Retry-After": str(context.retry_after_s)})
    if not context.thread.alive:
        return JSONResponse({"status": "the engine thread is not running"}, status_code=503)
    return {"status": "ok"}


@router.get("/metrics")
async def metrics(request: Request):
    return Response(context_of(request).metrics.exposition(), media_type=CONTENT_TYPE)


@router.get("/state")
async def state(request: Request):
    context = context_of(request)
    config = context.engine.config
    return {**context.thread.state, "model": context.limits.model_name, "max_num_seqs": config.max_num_seqs,
            "policy": config.policy, "max_waiting": context.thread.max_waiting}


@router.get("/", response_class=HTMLResponse)
async def index(request: Request):
    return page.html(context_of(request).limits.model_name)


@router.get(FONT_ROUTE)
async def font():
    return Response(web_font(), media_type="font/ttf", headers={"Cache-Control": "max-age=86400"})


def create_app(context: ServerContext) -> FastAPI:
    """The app serving `context`: the context in its state, OpenAI's error shapes, the router's routes;
    the engine's thread starts and stops with it (its lifespan)."""
    app = FastAPI(title="kvlab serve", summary="MiniMind behind OpenAI's API, on kvlab's paged serving engine",
                  lifespan=lifespan)
    app.state.context = context
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.include_router(router)
    return app
