"""A serving engine beside the engine: many requests at once over one paged KV cache.

kvlab.engine runs one batch at a time, as MiniMind's `generate` does. This package serves a stream of
requests the way vLLM and nano-vllm do, small enough to read in an afternoon, one idea a module:

  config.py           ServingConfig: the pool, the batch's slots and token budget, the policy
  request.py          SamplingParams, Request (its rows, block tables, state, events), RequestOutput
  block_pool.py       the blocks (K and V per layer, allocated once), free list, reference counts, prefix hashes
  paged_attention.py  write K and V through a block table, gather them back, MiniMind's attention
  runner.py           one forward step over a mixed batch of prefills and decodes
  scheduler.py        waiting and running queues, admission by free blocks, preemption, chunked prefill
  stats.py            the counters of a run
  engine.py           ServingEngine: add_request, step, run; abort and forget (for a server)

Its contract: every request's tokens are those `generate` gives its prompt alone, greedy or seeded,
whatever else runs beside it (tests/test_serving_engine.py). It imports no kvlab package but kvlab.engine.

What is exact, as measured (tools/serve_demo.py counts it): with per-request matmuls, a request fed in
the pieces `generate` feeds it (its prompt whole, then one token a step) gets `generate`'s very bits,
however many requests share its steps. Where the pieces differ (a prompt in chunks, a prefix from the
cache, recomputation after a preemption) so does the arithmetic: other row counts per matrix product,
and MiniMind's math attention where `generate`'s cache-free prefill takes PyTorch's flash kernel. The
logits then differ in their last bits (some 1e-6), and a token changes only where a draw is that close
to a tie: the tests and the demo count such mismatches rather than assume there are none.
"""

from kvlab.serving.alone import generate_alone
from kvlab.serving.config import ServingConfig
from kvlab.serving.engine import RequestUpdate, ServeResult, ServingEngine, StepOutput
from kvlab.serving.request import Event, RequestOutput, SamplingParams

__all__ = ["Event", "RequestOutput", "RequestUpdate", "SamplingParams", "ServeResult", "ServingConfig", "ServingEngine",
           "StepOutput", "generate_alone"]
