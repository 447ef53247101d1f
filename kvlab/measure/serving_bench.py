"""`kvlab serve` measured by a client over HTTP, as vLLM's `bench serve` measures a server: seeded
Poisson arrivals at rising request rates, every answer streamed, every token's arrival timed.

The measurement, for each server (SERVERS: the engine continuous on its compiled step, static on it,
or continuous and eager, request by request, as before the compiled step), a server of its own started
on a free loopback port and stopped with SIGTERM:
  1. a lone request, `lone_requests` times one after another (after one untimed warm-up): its median
     TTFT and TPOT set the SLOs, `slo_ttft_factor` x TTFT and `slo_tpot_factor` x TPOT (measured on the
     first server, kept for all);
  2. its saturation throughput: `saturation_requests` sent at once, completed requests per second;
     the offered rates are `rate_fractions` of the first server's, the same for every server;
  3. at each rate, requests arrive with exponential gaps (seeded), for at most `seconds_per_rate`
     seconds and `max_requests` requests; a run ends when every request has answered, or
     `request_timeout_s` after its last arrival (what is still open then counts as failed).

Per run (one row of results/serving/bench.csv): TTFT, TPOT = (latency - TTFT)/(tokens - 1), ITL (the
gaps between a request's tokens) and end-to-end latency, each p50/p90/p99 in ms; throughput
(completed requests and tokens per second over the run) and goodput: requests per second that met both
SLOs. Every request draws exactly `output_tokens` tokens (`ignore_eos`), seeded, at the config's
temperature and top-p, from a prompt of `prompt_tokens` tokens: bos and a validation document's
first tokens. The client runs on the same machine as the server: its CPU time is the server's loss.

No PyTorch here: the server process loads the model; this one only sends requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.facts.arrivals import poisson_arrivals

log = logging.getLogger("kvlab")
logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2e")
# The servers a bench may start, by name: `kvlab serve`'s flags for each.
SERVERS = {
    "continuous": ["--policy", "continuous"],  # the engine's default: continuous batching, one compiled step
    "static": ["--policy", "static"],  # a batch runs until its longest request is done, then the next
    "eager": ["--policy", "continuous", "--enforce-eager", "--matmuls", "fused"],  # the engine before its compiled step
}


# --- the server, as a child process ----------------------------------------------------------------

class ServerProcess:
    """`kvlab serve ARGS` started as `python -m kvlab.server` (this interpreter, this checkout's package)
    on 127.0.0.1 and a free port the server picks and writes to a file. Use as a context manager, or
    start() ... wait_ready() ... stop()."""

    def __init__(self, args: list[str], log_path=None, env: dict | None = None, ready_timeout: float = 120.0):
        self.args = [str(arg) for arg in args]
        self.ready_timeout = ready_timeout
        self.log_path = Path(log_path) if log_path else None
        self.env = env
        self.folder = tempfile.TemporaryDirectory(prefix="kvlab-serve-")
        self.port_file = Path(self.folder.name) / "port"
        self.process: subprocess.Popen | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ServerProcess":
        log_path = self.log_path or Path(self.folder.name) / "server.log"
        self.log_path = log_path
        self._log = open(log_path, "w", encoding="utf-8")
        command = [sys.executable, "-m", "kvlab.server", "serve", "--host", "127.0.0.1", "--port", "0",
                   "--port-file", str(self.port_file), *self.args]
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        return self

    def log_tail(self, lines: int = 20) -> str:
        if not self._log.closed:
            self._log.flush()
        return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])

    def wait_ready(self, timeout: float | None = None) -> "ServerProcess":
        """Until GET /health answers 200; raises with the server's log if it exits or takes too long."""
        timeout = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"kvlab serve exited with {self.process.returncode}:\n{self.log_tail()}")
            if self.port is None and self.port_file.is_file() and self.port_file.read_text().strip():
                self.port = int(self.port_file.read_text())
            if self.port is not None:
                try:
                    with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                        if response.status == 200:
                            return self
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"kvlab serve was not ready within {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then its exit status (killed, and an error raised, if it outlives `timeout`)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise RuntimeError(f"kvlab serve did not stop within {timeout:.0f} s of SIGTERM:\n{self.log_tail()}")
        self._log.close()
        return self.process.returncode

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> "ServerProcess":
        return self.start().wait_ready()

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            self.kill()
            self.folder.cleanup()


# --- one request, streamed -------------------------------------------------------------------------

@dataclass
class Answer:
    """One request as the client saw it: when it was sent, when each token arrived (perf_counter)."""

    sent: float
    token_times: list[float] = field(default_factory=list)
    status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and bool(self.token_times)

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.sent

    @property
    def e2e(self) -> float:
        return self.token_times[-1] - self.sent

    @property
    def tpot(self) -> float | None:
        tokens = len(self.token_times)
        return None if tokens < 2 else (self.e2e - self.ttft) / (tokens - 1)

    @property
    def itls(self) -> list[float]:
        return [later - earlier for earlier, later in zip(self.token_times, self.token_times[1:])]


async def stream_completion(client, url: str, body: dict, timeout: float) -> Answer:
    """POST /v1/completions with stream and return_token_ids, timing each token's chunk."""
    answer = Answer(time.perf_counter())
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
                answer.status = response.status_code
                if response.status_code != 200:
                    answer.error = (await response.aread()).decode("utf-8", "replace")[:200]
                    return answer
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    now = time.perf_counter()
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        answer.error = chunk["error"]["message"]
                    for choice in chunk.get("choices", []):
                        answer.token_times += [now] * len(choice.get("token_ids") or [])
                        if choice.get("finish_reason") not in (None, "stop", "length"):
                            answer.error = f"finish_reason {choice['finish_reason']}"
    except TimeoutError:
        answer.error = f"no answer within {timeout} s"
    except Exception as err:  # a refused or dropped connection is a failed request, not a failed bench
        answer.error = f"{type(err).__name__}: {err}"
    return answer


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]  # cycled through, request by request
    output_tokens: int
    temperature: float
    top_p: float
    seed: int
    model: str | None = None

    def body(self, index: int) -> dict:
        body = {"prompt": self.prompts[index % len(self.prompts)], "max_tokens": self.output_tokens,
                "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed + index, "stream": True,
                "ignore_eos": True, "return_token_ids": True, "stream_options": {"include_usage": False}}
        return body | ({"model": self.model} if self.model else {})


def arrivals_at(rate: float, count: int, seconds: float, seed: int) -> list[float]:
    """Arrival offsets (s) at `rate` per second: at most `count`, none after `seconds`, the first at 0
    (kvlab.facts.arrivals). A rate of inf sends all `count` at once."""
    return poisson_arrivals(count, rate, seed, until=seconds)


async def drive(url: str, workload: Workload, arrivals: list[float], timeout: float, first_index: int = 0):
    """Send request i at arrivals[i] (s from now), each streamed; returns every Answer and the run's wall time
    (first send to last token or failure)."""
    import httpx

    limits = httpx.Limits(max_connections=len(arrivals) + 1, max_keepalive_connections=len(arrivals) + 1)
    # TCP_NODELAY, as aiohttp (vLLM's bench client) sets it: without it a request's body waits behind its
    # headers for the server's delayed ACK, some 40 ms on Linux, and every TTFT carries them
    transport = httpx.AsyncHTTPTransport(limits=limits, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), transport=transport, trust_env=False) as client:
        start = time.perf_counter()

        async def send(index: int, at: float) -> Answer:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            return await stream_completion(client, url, workload.body(first_index + index), timeout)

        answers = await asyncio.gather(*(send(index, at) for index, at in enumerate(arrivals)))
    ends = [a.token_times[-1] if a.token_times else a.sent for a in answers]
    return answers, max(ends) - start


# --- the numbers of a run ----------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, linear between closest ranks (numpy's default), or NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(answers: list[Answer], wall_s: float, slo_ttft: float, slo_tpot: float) -> dict:
    """One run's columns: counts, throughput and goodput, and every latency's percentiles in ms."""
    done = [answer for answer in answers if answer.ok]
    values = {"ttft": [a.ttft for a in done], "tpot": [a.tpot for a in done if a.tpot is not None],
              "itl": [gap for a in done for gap in a.itls], "e2e": [a.e2e for a in done]}
    good = [a for a in done if a.ttft <= slo_ttft and (a.tpot is None or a.tpot <= slo_tpot)]
    row = {"requests": len(answers), "completed": len(done),
           "rejected": sum(answer.status == 503 for answer in answers),
           "failed": len(answers) - len(done), "duration_s": round(wall_s, 3),
           "throughput_rps": round(len(done) / wall_s, 3) if wall_s > 0 else math.nan,
           "output_tok_s": round(sum(len(a.token_times) for a in done) / wall_s, 1) if wall_s > 0 else math.nan,
           "goodput_rps": round(len(good) / wall_s, 3) if wall_s > 0 else math.nan,
           "slo_met_share": round(len(good) / len(answers), 3) if answers else math.nan}
    for name in LATENCIES:
        for q in PERCENTILES:
            row[f"{name}_p{q}_ms"] = round(percentile(values[name], q) * 1000, 2)
    return row


# --- the whole measurement ---------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchPlan:
    """Every knob of the measurement (config extras.serve_bench)."""

    servers: tuple[str, ...]
    rate_fractions: tuple[float, ...]
    lone_requests: int
    saturation_requests: int
    seconds_per_rate: float
    max_requests: int
    request_timeout_s: float
    slo_ttft_factor: float
    slo_tpot_factor: float


def serve_bench(server_args: list[str], workload: Workload, plan: BenchPlan, log_folder=None,
                ready_timeout: float = 120.0) -> tuple[list[dict], dict]:
    """Run the measurement (the module's docstring). `server_args`: `kvlab serve`'s arguments but the
    server's own (SERVERS). Returns (rows, side): a row per server and rate, and each server's lone
    request and saturation, and the SLOs."""
    side: dict = {"lone": {}, "saturation": {}}
    rows: list[dict] = []
    index = 0  # every request of the whole bench has its own seed and prompt position
    for name in plan.servers:
        log_path = Path(log_folder, f"server_{name}.log") if log_folder else None
        with ServerProcess([*server_args, *SERVERS[name]], log_path=log_path, ready_timeout=ready_timeout) as server:
            asyncio.run(drive(server.url, workload, [0.0], plan.request_timeout_s, index))  # warm-up, untimed
            index += 1
            lone = []
            for _ in range(plan.lone_requests):
                answers, _ = asyncio.run(drive(server.url, workload, [0.0], plan.request_timeout_s, index))
                index += 1
                lone += answers
            failed = [a.error or f"HTTP {a.status}" for a in lone if not a.ok]
            if failed:
                raise RuntimeError(f"a lone request failed: {failed[0]}\n{server.log_tail()}")
            lone_ttft = statistics.median(a.ttft for a in lone)
            lone_tpot = statistics.median(a.tpot for a in lone if a.tpot is not None) \
                if workload.output_tokens > 1 else math.nan
            side["lone"][name] = {"ttft_ms": round(lone_ttft * 1000, 2), "tpot_ms": round(lone_tpot * 1000, 2)}
            if "slo" not in side:
                side["slo"] = {"ttft_ms": round(plan.slo_ttft_factor * lone_ttft * 1000, 2),
                               "tpot_ms": round(plan.slo_tpot_factor * lone_tpot * 1000, 2),
                               "ttft_factor": plan.slo_ttft_factor, "tpot_factor": plan.slo_tpot_factor,
                               "measured_on": name}
            slo_ttft, slo_tpot = side["slo"]["ttft_ms"] / 1000, side["slo"]["tpot_ms"] / 1000
            answers, wall = asyncio.run(drive(server.url, workload, [0.0] * plan.saturation_requests,
                                              plan.request_timeout_s, index))
            index += len(answers)
            burst = summary(answers, wall, slo_ttft, slo_tpot)
            if not burst["completed"]:
                raise RuntimeError(f"no request of the saturation burst completed\n{server.log_tail()}")
            side["saturation"][name] = burst
            side.setdefault("saturation_rps", burst["throughput_rps"])  # the first server's: the rates' base
            log.info("saturation (%s): %.3f requests/s, %s tokens/s", name, burst["throughput_rps"],
                     burst["output_tok_s"])
            for number, fraction in enumerate(plan.rate_fractions):
                rate = fraction * side["saturation_rps"]
                arrivals = arrivals_at(rate, plan.max_requests, plan.seconds_per_rate, seed=workload.seed + 1000 * number)
                answers, wall = asyncio.run(drive(server.url, workload, arrivals, plan.request_timeout_s, index))
                index += len(answers)
                row = {"server": name, "rate_fraction": fraction, "rate_rps": round(rate, 3),
                       "output_tokens": workload.output_tokens,
                       **summary(answers, wall, slo_ttft, slo_tpot),
                       "slo_ttft_ms": side["slo"]["ttft_ms"], "slo_tpot_ms": side["slo"]["tpot_ms"],
                       "saturation_rps": burst["throughput_rps"]}
                log.info("%s at %.2f x saturation (%.2f req/s): %d/%d completed, TTFT p50 %.1f ms p99 %.1f ms, "
                         "TPOT p50 %.2f ms, goodput %.3f req/s", name, fraction, rate, row["completed"],
                         row["requests"], row["ttft_p50_ms"], row["ttft_p99_ms"], row["tpot_p50_ms"],
                         row["goodput_rps"])
                rows.append(row)
            status = server.stop()
            log.info("kvlab serve (%s), its log's end:\n%s", name, server.log_tail(12))
            if status != 0:
                raise RuntimeError(f"kvlab serve exited with {status} after SIGTERM\n{server.log_tail()}")
    side["cpu_count"] = os.cpu_count()
    return rows, side
