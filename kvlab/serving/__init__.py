"""A serving engine beside the engine: many requests at once over one paged KV cache.

kvlab.engine runs one batch at a time, as MiniMind's `generate` does. This package serves a stream of
requests the way vLLM and nano-vllm do, small enough to read in an afternoon, one idea a module:

  config.py          ServingConfig: the pool, the batch's slots and token budget, the policy, the way
  request.py         SamplingParams, Request (its rows, block tables, state, events), RequestOutput
  block_pool.py      the blocks (K and V per layer, allocated once), free list, reference counts, prefix hashes
  block_manager.py   a request's blocks in its own verbs: allocate, append, free, fork, cache full blocks
  scheduler.py       the queues (pending, waiting, running), admission by free blocks, preemption, chunked prefill
  paged_attention.py K and V through a block table: MiniMind's attention per request, and per (row, block) pair
  compiled_step.py   every row of a step in one compiled call, compiled once for every size
  runner.py          one forward step over a mixed batch: the compiled step, or eager request by request
  stats.py           the counters of a run and each step's record (counts and seconds)
  engine.py          ServingEngine: add_request, step (what it did), run, warm_up; abort and forget (a server)
  alone.py           generate_alone: what `generate` gives a prompt alone, the contract

    engine = ServingEngine(model, ServingConfig(num_blocks=1024, max_num_seqs=64))
    engine.add_request(prompt_ids, SamplingParams(max_tokens=64))
    result = engine.run()

Its contract: every request's tokens are those `generate` gives its prompt alone, greedy or seeded,
whatever else runs beside it (tests/test_serving_engine.py). It imports kvlab.engine, the facts (its pool
arithmetic, kvlab.facts.formulas) and kvlab.kernels (the compiled step's C++ operators), nothing else of kvlab.

What is exact, as measured (tools/serve_demo.py counts it): eager with per-request matmuls
(`ServingConfig(compile=False)`), a request fed in the pieces `generate` feeds it (its prompt whole,
then one token a step) gets `generate`'s very bits, however many requests share its steps. The
compiled step (the default) computes every row's products in one call and attention block by block,
so the logits differ from `generate`'s in their last bits (some 1e-6); so do the eager path's where the
pieces differ (a prompt in chunks, a prefix from the cache, recomputation after a preemption). A token
changes only where a draw is that close to a tie: the tests and the demo count such mismatches rather
than assume there are none.
"""

from kvlab.serving.alone import generate_alone
from kvlab.serving.config import ServingConfig
from kvlab.serving.engine import RequestUpdate, ServeResult, ServingEngine, StepOutput
from kvlab.serving.request import Event, RequestOutput, SamplingParams

__all__ = ["Event", "RequestOutput", "RequestUpdate", "SamplingParams", "ServeResult", "ServingConfig", "ServingEngine",
           "StepOutput", "generate_alone"]
