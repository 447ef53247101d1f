"""The server's Prometheus metrics, in a registry of its own (GET /metrics), named as vLLM names them
where one fits (docs.vllm.ai, "Production Metrics"), kvlab's own where vLLM has none. Every metric
carries the label model_name, as vLLM's do.

  vllm:num_requests_running            gauge      requests in the engine's running queue (holding blocks)
  vllm:num_requests_waiting            gauge      requests queued: not admitted yet, or preempted
  vllm:kv_cache_usage_perc             gauge      blocks in use / all blocks (0 to 1)
  kvlab:kv_blocks_used, kvlab:kv_blocks_free  gauges  the pool's blocks (a freed block keeps its prefix
                                                  hash but counts as free)
  vllm:prompt_tokens_total             counter    prompt tokens of the requests taken in
  vllm:generation_tokens_total         counter    tokens drawn and sent (every sample's, its eos included)
  vllm:num_preemptions_total           counter    requests preempted (blocks taken back, computed again)
  vllm:request_success_total           counter    samples finished, by finished_reason: stop, length, abort
  kvlab:requests_rejected_total        counter    503s, by reason: overloaded (the waiting queue full), shutdown
  vllm:time_to_first_token_seconds     histogram  from the request's arrival at the server to its first token
  vllm:inter_token_latency_seconds     histogram  between a request's successive draws
  vllm:request_time_per_output_token_seconds  histogram  a request's TPOT: (last draw - first) / (draws - 1)
  vllm:e2e_request_latency_seconds     histogram  from arrival to the last token
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Seconds: the lab's model answers a lone request's first token in milliseconds on a CPU.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        label = {"labelnames": ["model_name"], "registry": self.registry}

        def gauge(name, doc):
            return Gauge(name, doc, **label).labels(model_name)

        def counter(name, doc):
            return Counter(name, doc, **label).labels(model_name)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, buckets=buckets, **label).labels(model_name)

        self.running = gauge("vllm:num_requests_running", "Requests running (holding blocks).")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting: not admitted yet, or preempted.")
        self.cache_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of the pool's blocks in use (0 to 1).")
        self.blocks_used = gauge("kvlab:kv_blocks_used", "Blocks some request holds.")
        self.blocks_free = gauge("kvlab:kv_blocks_free", "Blocks nobody holds (a cached prefix among them).")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of the requests taken in.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens drawn and sent, eos included.")
        self.preemptions = counter("vllm:num_preemptions", "Requests preempted.")
        self.success = Counter("vllm:request_success", "Samples finished, by reason.",
                               labelnames=["model_name", "finished_reason"], registry=self.registry)
        self.rejected = Counter("kvlab:requests_rejected", "Requests refused with 503, by reason.",
                                labelnames=["model_name", "reason"], registry=self.registry)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Arrival to first token.", LATENCY_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Between a request's successive draws.",
                             TOKEN_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds", "A request's time per output token "
                              "after the first.", TOKEN_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to the last token.", LATENCY_BUCKETS)
        self.model_name = model_name

    def finished(self, reason: str) -> None:
        self.success.labels(self.model_name, reason).inc()

    def reject(self, reason: str) -> None:
        self.rejected.labels(self.model_name, reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
