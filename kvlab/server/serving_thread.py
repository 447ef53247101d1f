"""The serving thread (ServingThread), the one thread that owns the model: it steps the serving engine
and feeds each request's stream.

HTTP handlers run on the event loop and never touch the engine. A handler `submit`s a prompt and its
SamplingParams and gets a RequestStream, an asyncio queue the engine thread fills:

    stream = thread.submit(prompt_ids, params)   # Overloaded / ShuttingDown: a 503
    async for event in stream.events():          # Tokens(rows) ..., then Finished or Failed
        ...
    thread.abort(stream)                         # the client left: blocks back before the next step

The thread's round: take the submissions and aborts that came in, add and abort them in the engine,
run one `step` (a forward pass over every running request), then push to each stream the tokens its
rows drew, and close the streams of finished requests (the engine forgets them). With nothing to do it
sleeps on a condition until a handler wakes it. Metrics and the live state (GET /state) are updated
after every round.

Overload: at most `max_waiting` requests may wait for their first admission; the next is refused at
once (a 503 with Retry-After) rather than queued without bound. Shutdown: `drain(seconds)` refuses new
requests and lets the running ones go on for `seconds`, then aborts what is left (their streams end
with finish_reason "abort"); `stop` ends the thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

from kvlab.serving import RequestUpdate, SamplingParams, ServingEngine

from kvlab.server.metrics import ServerMetrics
from kvlab.server.protocol import FINISH_REASONS

log = logging.getLogger("kvlab.server")

RECENT_STEPS = 64  # the step records the live page shows (the engine `kvlab serve` starts keeps no more)


class Overloaded(Exception):
    """The waiting queue is full."""


class ShuttingDown(Exception):
    """The server drains: no new request."""


@dataclass(frozen=True)
class Tokens:
    """The tokens each row (sample) drew since the last event; a row past its eos draws none."""

    rows: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Finished:
    reasons: tuple[str, ...]  # per row: "eos", "length" or "abort"
    prompt_tokens: int
    completion_tokens: int  # over every row, each eos included


@dataclass(frozen=True)
class Failed:
    status: int
    message: str


class RequestStream:
    """One request as its handler sees it. The engine thread writes every field but `queue`'s reader."""

    def __init__(self, prompt: list[int], params: SamplingParams, event_loop: asyncio.AbstractEventLoop):
        self.prompt = prompt
        self.params = params
        self.queue: asyncio.Queue = asyncio.Queue()
        self.event_loop = event_loop
        self.request_id: int | None = None
        self.received = time.perf_counter()
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.draws = 0
        self.admitted = False
        self.closed = False

    def push(self, event) -> None:
        try:
            self.event_loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody reads any more
            pass

    async def events(self):
        while True:
            event = await self.queue.get()
            yield event
            if isinstance(event, (Finished, Failed)):
                return


class ServingThread:
    def __init__(self, engine: ServingEngine, metrics: ServerMetrics, max_waiting: int):
        self.engine = engine
        self.metrics = metrics
        self.max_waiting = max_waiting
        self._cond = threading.Condition()
        self._inbox: list[RequestStream] = []
        self._aborts: list[RequestStream] = []
        self._unadmitted = 0  # submitted, not admitted yet (under _cond)
        self._stopping = False
        self._draining = False
        self._drain_deadline: float | None = None
        self._live: dict[int, RequestStream] = {}  # by engine request id (engine thread only)
        self._preemptions_seen = 0
        self.steps = 0
        self.failed: str | None = None  # the engine's last error, if a step raised
        self.state = self._snapshot()
        self._thread = threading.Thread(target=self._run, name="kvlab-engine", daemon=True)

    # --- the event loop's side -------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def drained(self) -> bool:
        """Draining, and no request is left to end: none queued, none in the engine (or the thread is gone)."""
        with self._cond:
            queued = bool(self._inbox)
        return self._draining and (not (queued or self._live) or not self._thread.is_alive())

    def submit(self, prompt: list[int], params: SamplingParams) -> RequestStream:
        """Queue a request (called on the event loop). Raises Overloaded or ShuttingDown."""
        with self._cond:
            if self._draining or self._stopping:
                raise ShuttingDown()
            if self._unadmitted >= self.max_waiting:
                raise Overloaded()
            stream = RequestStream(prompt, params, asyncio.get_running_loop())
            self._inbox.append(stream)
            self._unadmitted += 1
            self._cond.notify()
        return stream

    def abort(self, stream: RequestStream) -> None:
        """The client left: the engine thread aborts the request before its next step."""
        with self._cond:
            if not stream.closed:
                self._aborts.append(stream)
                self._cond.notify()

    def drain(self, seconds: float) -> None:
        """Refuse new requests; abort what still runs `seconds` from now."""
        with self._cond:
            self._draining = True
            self._drain_deadline = time.perf_counter() + seconds
            self._cond.notify()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- the engine thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._inbox or self._aborts or self._stopping or self.engine.has_unfinished()
                           or self._deadline_passed()):
                    self._cond.wait(self._wait_s())
                if self._stopping:
                    break
                inbox, self._inbox = self._inbox, []
                aborts, self._aborts = self._aborts, []
            self._take(inbox)
            for stream in aborts:
                self._abort(stream)
            if self._deadline_passed():
                for stream in list(self._live.values()):
                    self._abort(stream)
            if self.engine.has_unfinished():
                self._step()
            self.state = self._snapshot()
        for stream in list(self._live.values()):
            self._abort(stream)
        for stream in self._inbox:
            stream.push(Failed(503, "the server stopped"))

    def _deadline_passed(self) -> bool:
        return self._drain_deadline is not None and time.perf_counter() >= self._drain_deadline and bool(self._live)

    def _wait_s(self) -> float | None:
        """How long to sleep without news: until the drain's deadline, if one is still to come."""
        left = None if self._drain_deadline is None else self._drain_deadline - time.perf_counter()
        return left if left is not None and left > 0 else None

    def _take(self, streams: list[RequestStream]) -> None:
        for stream in streams:
            try:
                request_id = self.engine.add_request(stream.prompt, stream.params)
            except ValueError as err:  # the handler checked first; the engine's own check is the last word
                self._close_unadmitted(stream)
                stream.closed = True
                stream.push(Failed(400, str(err)))
                continue
            stream.request_id = request_id
            self._live[request_id] = stream
            self.metrics.prompt_tokens.inc(len(stream.prompt))

    def _step(self) -> None:
        try:
            done = self.engine.step()
        except Exception as err:  # a bug: fail what runs, keep serving
            log.exception("the engine's step failed")
            self.failed = f"{type(err).__name__}: {err}"
            for stream in list(self._live.values()):
                self.engine.abort(stream.request_id)
                self._close(stream, None, Failed(500, f"the engine failed: {self.failed}"))
            return
        if done.record is None:
            return  # a wait for an arrival: nothing ran
        self.steps += 1
        preemptions = self.engine.stats.preemptions
        self.metrics.preemptions.inc(preemptions - self._preemptions_seen)
        self._preemptions_seen = preemptions
        now = time.perf_counter()
        for update in done.updates:
            stream = self._live.get(update.request_id)
            if stream is not None:
                self._publish(stream, update, now)

    def _publish(self, stream: RequestStream, update: RequestUpdate, now: float) -> None:
        """Forward what the step did to the request: its admission, the tokens its rows drew, its end."""
        if update.admitted:
            self._close_unadmitted(stream)
        if update.tokens is not None and any(update.tokens):
            if stream.first_token_at is None:
                stream.first_token_at = now
                self.metrics.ttft.observe(now - stream.received)
            else:
                self.metrics.itl.observe(now - stream.last_token_at)
            stream.last_token_at = now
            stream.draws += 1
            self.metrics.generation_tokens.inc(sum(len(row) for row in update.tokens))
            stream.push(Tokens(update.tokens))
        if update.output is not None:
            self._close(stream, update.output)

    def _abort(self, stream: RequestStream) -> None:
        if stream.request_id not in self._live:
            return
        output = self.engine.abort(stream.request_id)
        self._close(stream, output)

    def _close_unadmitted(self, stream: RequestStream) -> None:
        if not stream.admitted:
            stream.admitted = True
            with self._cond:
                self._unadmitted -= 1

    def _close(self, stream: RequestStream, output, event=None) -> None:
        """End a request's stream: Finished from its output (or the given event), metrics, and the engine
        forgets it."""
        self._close_unadmitted(stream)
        if event is None:
            reasons = tuple(output.finish_reasons)
            completion = sum(len(sample) for sample in output.samples)
            event = Finished(reasons, len(output.prompt), completion)
            for reason in reasons:
                self.metrics.finished(FINISH_REASONS[reason])  # OpenAI's names: the engine's eos is "stop"
            if stream.first_token_at is not None and "abort" not in reasons:
                self.metrics.e2e.observe(stream.last_token_at - stream.received)
                if stream.draws > 1:
                    self.metrics.tpot.observe((stream.last_token_at - stream.first_token_at) / (stream.draws - 1))
        stream.closed = True
        stream.push(event)
        del self._live[stream.request_id]
        self.engine.forget(stream.request_id)

    def recent_steps(self) -> list:
        """The engine's last RECENT_STEPS step records (it keeps at most its config's step_records)."""
        steps = self.engine.stats.steps
        return [steps[index] for index in range(max(0, len(steps) - RECENT_STEPS), len(steps))]

    def _snapshot(self) -> dict:
        """The engine's state after a round, for the gauges and GET /state (read by the event loop)."""
        engine, pool = self.engine, self.engine.pool
        scheduler = engine.scheduler
        with self._cond:
            queued = len(self._inbox)
        running, waiting = len(scheduler.running), len(scheduler.waiting) + len(scheduler.pending) + queued
        self.metrics.running.set(running)
        self.metrics.waiting.set(waiting)
        self.metrics.blocks_used.set(pool.num_used)
        self.metrics.blocks_free.set(pool.num_free)
        self.metrics.cache_usage.set(pool.num_used / pool.num_blocks)
        return {
            "running": running, "waiting": waiting, "blocks_used": pool.num_used, "blocks_free": pool.num_free,
            "num_blocks": pool.num_blocks, "block_size": pool.block_size, "steps": self.steps,
            "preemptions": engine.stats.preemptions, "prefix_hit_tokens": engine.stats.prefix_hit_tokens,
            "draining": self._draining, "failed": self.failed,
            "requests": [{"id": request.request_id, "state": request.state.value, "prompt_tokens": request.prompt_len,
                          "new_tokens": request.num_new, "max_tokens": request.params.max_tokens, "n": request.n,
                          "blocks": sum(len(row.block_table) for row in request.rows)}
                         for request in (*scheduler.running, *scheduler.waiting)],
            "recent_steps": [{"step": s.step, "prefill": s.prefill_tokens, "decode": s.decode_tokens,
                              "running": s.running, "blocks": s.blocks_in_use} for s in self.recent_steps()],
        }
