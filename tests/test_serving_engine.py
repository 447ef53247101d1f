"""The serving engine's contract: every request's tokens are those `generate` gives its prompt alone,
greedy or seeded, however the engine served it (mixed prefill and decode steps, preemption and
recomputation, prefix hits, chunked prefill, n samples sharing a prompt, static or continuous), and
the pool is empty afterwards. Each case counts its mismatches and expects none."""
from pathlib import Path

import pytest
import torch

from kvlab.engine import sampling
from kvlab.serving import SamplingParams, ServingConfig

from kvlab.serving import ServingEngine

from serving_helpers import (GREEDY, alone, assert_pool_empty, mismatches, one_thread, prompts_of, serve,  # noqa: F401
                             tiny_model)

LENGTHS = (3, 5, 8, 11, 12, 13, 17, 31, 40, 57)


@pytest.fixture(scope="module")
def model():
    return tiny_model(0)


def greedy(max_tokens=16, **knobs):
    return SamplingParams(max_tokens=max_tokens, eos_token_id=None, **{**GREEDY, **knobs})


def staggered(prompts, params, every=2):
    """One request arriving every `every` steps, so prefills land in steps that decode others."""
    return [(prompt, params, index * every) for index, prompt in enumerate(prompts)]


def generate_logits(model, prompt, max_tokens):
    """Every draw's logits of greedy `generate` on the prompt alone."""
    expected = []
    forward = model.forward

    def recording(*args, **kwargs):
        out = forward(*args, **kwargs)
        expected.append(out.logits[:, -1])
        return out

    model.forward = recording
    try:
        model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, eos_token_id=None, **GREEDY)
    finally:
        del model.forward
    return expected


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_mixed_prefill_and_decode_steps_equal_generate_alone(model, compile):
    """Eager, request by request (matmuls per request), each draw's logits are generate's own bits;
    compiled, all rows in one step, they are within rounding and the tokens the same."""
    requests = staggered(prompts_of(LENGTHS), greedy(16))
    drawn = {}
    result, engine = serve(model, ServingConfig(num_blocks=64, max_num_seqs=6, compile=compile), requests,
                           on_draw=lambda rid, logits: drawn.setdefault(rid, []).append(logits.clone()))
    assert mismatches(model, result, requests) == []
    assert any(s.prefill_tokens and s.decode_tokens for s in result.stats.steps), "no step mixed the two"
    assert max(s.useful_slots for s in result.stats.steps) > 2
    for rid, (prompt, _, _) in enumerate(requests):
        expected = generate_logits(model, prompt, 16)
        pairs = list(zip(drawn[rid], expected, strict=True))
        if compile:
            assert all(torch.allclose(a, b, atol=1e-5, rtol=0) for a, b in pairs), f"request {rid}"
        else:
            assert all(torch.equal(a, b) for a, b in pairs), f"request {rid}"
    assert_pool_empty(engine)
    assert engine.compiled == compile


def test_the_engine_keeps_the_step_records_its_config_bounds_and_counts_every_step(model):
    """ServingConfig.step_records: the engine keeps the last so many step records (a server steps for
    ever), while its counts, summary and tokens are those of the run that kept every record."""
    requests = staggered(prompts_of(LENGTHS), greedy(16))
    every, _ = serve(model, ServingConfig(num_blocks=64, max_num_seqs=6, compile=False), requests)
    kept, _ = serve(model, ServingConfig(num_blocks=64, max_num_seqs=6, compile=False, step_records=3), requests)
    assert len(every.stats.steps) == every.stats.forward_steps > 3
    assert [s.step for s in kept.stats.steps] == [s.step for s in list(every.stats.steps)[-3:]]
    timeless = lambda stats: {k: v for k, v in stats.summary().items() if k != "wall_s"}  # noqa: E731
    assert timeless(kept.stats) == timeless(every.stats)
    assert every.stats.prefill_tokens == sum(s.prefill_tokens for s in every.stats.steps)
    assert every.stats.peak_blocks_in_use == max(s.blocks_in_use for s in every.stats.steps)
    assert [o.samples for o in kept.outputs] == [o.samples for o in every.outputs]
    with pytest.raises(ValueError, match="ServingConfig.step_records"):
        ServingConfig(step_records=0)


def test_one_compiled_step_serves_every_size_without_recompiling(model):
    """The step compiled once (its sizes symbolic) serves steps of 1 to 6 rows, prompts and decodes,
    contexts of 3 to 73 positions: nothing is compiled after the warm-up, nor does dynamo trace."""
    from kvlab.kernels.torch_internals import compiled_graphs

    engine = ServingEngine(model, ServingConfig(num_blocks=64, max_num_seqs=6))
    engine.warm_up()
    graphs, program = compiled_graphs(), engine.runner.compiled.program
    requests = staggered(prompts_of(LENGTHS, seed=21), greedy(16), every=3)
    for prompt, params, arrival in requests:
        engine.add_request(prompt, params, arrival_step=arrival)
    result = engine.run()
    rows = {s.prefill_tokens + s.decode_tokens for s in result.stats.steps}
    assert min(rows) == 1 and max(rows) > 40, rows
    assert compiled_graphs() == graphs and engine.runner.compiled.program is program
    assert engine.runner.compiled.compiles <= 1
    assert engine.runner.compiled.calls == len(result.stats.steps) + 1
    assert mismatches(model, result, requests) == []


def test_the_compiled_package_is_the_eager_step_for_steps_of_every_kind(model):
    """After the warm-up the step calls the AOTInductor package (exported on example sizes none of
    these steps has): for steps of every kind (one decode row, many, prompt chunks beside decode rows,
    contexts over several blocks) the logits are the eager step's within rounding, the K and V it
    wrote into the pool are the eager step's, and its greedy picks are `greedy_pick_rows`'s at each
    row's temperature; dynamo traces nothing."""
    from kvlab.kernels.torch_internals import compiled_graphs
    from kvlab.serving.compiled_step import step_logits, step_rows

    engine = ServingEngine(model, ServingConfig(num_blocks=64, max_num_seqs=6))
    engine.warm_up()
    step = engine.runner.compiled
    graphs, size = compiled_graphs(), engine.pool.block_size
    steps = [
        [([7], 0, [0], True)],
        [([7], 5, [0], True), ([9], 40, [1, 2, 3], True), ([4], 17, [4, 5], True)],
        [(list(range(3, 3 + 2 * size + 3)), 0, [6, 7, 8], True), ([5], 12, [9], True)],
        [(list(range(3, 12)), 20, [10, 11], False), ([5], 2, [12], True)],
    ]
    for pieces in steps:
        temperatures = [0.85, 0.3, 1.7][:sum(wants for *_, wants in pieces)]
        logits, picks = step(pieces, temperatures)
        written = [tensor.clone() for tensor in (*engine.pool.keys, *engine.pool.values)]
        with torch.inference_mode():  # as the step builds its rows
            rows = step_rows(pieces, size, engine.pool.scratch_block, "cpu", temperatures)
            eager = step_logits(rows, step.weights.views, engine.pool.keys, engine.pool.values, step.shape,
                                step.native)
        assert torch.allclose(logits, eager[:len(logits)], atol=1e-5, rtol=1e-4), pieces
        assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4)
                   for a, b in zip(written, (*engine.pool.keys, *engine.pool.values))), pieces
        assert picks.tolist() == sampling.greedy_pick_rows(logits, temperatures), pieces
    assert compiled_graphs() == graphs


def test_each_architecture_gets_a_package_of_its_own():
    """Models of three architectures in one process (a test run, a lab comparing models): each engine's
    step calls a package compiled for its own architecture, each kept in a file of its own, and every
    token is `generate`'s."""
    paths = set()
    for hidden in (32, 48, 80):
        model = tiny_model(0, hidden_size=hidden)
        requests = staggered(prompts_of((5, 9)), greedy(4))
        result, engine = serve(model, ServingConfig(num_blocks=16, max_num_seqs=2), requests)
        assert engine.runner.compiled.program is not None, hidden
        paths.add(engine.runner.compiled.program.path)
        assert mismatches(model, result, requests) == [], hidden
    assert len(paths) == 3


def built_libraries() -> set:
    """The C++ libraries in inductor's cache directory."""
    from kvlab.kernels.torch_internals import inductor_cache_dir

    return set(Path(inductor_cache_dir()).rglob("*.so"))


def test_a_compiled_step_is_kept_and_a_new_process_loads_it(model, monkeypatch):
    """The compiled step is kept on disk: an engine of the same architecture in a new process (the
    process's loaded steps forgotten) loads it, compiling nothing (no package, no C++ library in
    inductor's cache built again), and serves generate's tokens; a
    file that cannot be loaded is said so, compiled again and replaced."""
    from kvlab.engine import aot
    from kvlab.kernels.torch_internals import compiled_graphs

    requests = staggered(prompts_of((6, 11, 4)), greedy(6))
    first = ServingEngine(model, ServingConfig(num_blocks=32, max_num_seqs=3))
    first.warm_up()
    path = first.runner.compiled.program.path
    assert path.is_file() and path.parent == aot.cache_dir()
    monkeypatch.setattr(aot, "_LOADED", {})
    graphs, libraries = compiled_graphs(), built_libraries()
    result, again = serve(model, ServingConfig(num_blocks=32, max_num_seqs=3), requests)
    assert again.runner.compiled.program.from_cache and again.runner.compiled.compiles == 0
    assert built_libraries() == libraries, "loading the step built its C++ again"
    assert compiled_graphs() == graphs and mismatches(model, result, requests) == []
    # a file cut short: not used, compiled again and replaced
    path.write_bytes(path.read_bytes()[:100])
    monkeypatch.setattr(aot, "_LOADED", {})
    with pytest.warns(RuntimeWarning, match="cannot be loaded"):
        result, rebuilt = serve(model, ServingConfig(num_blocks=32, max_num_seqs=3), requests)
    assert not rebuilt.runner.compiled.program.from_cache and rebuilt.runner.compiled.compiles == 1
    assert mismatches(model, result, requests) == [] and path.stat().st_size > 100


SAMPLED = [
    dict(temperature=0.7, top_p=0.9, top_k=0),
    dict(temperature=1.3, top_p=1.0, top_k=20),
    dict(temperature=2.5, top_p=0.6, top_k=50, repetition_penalty=1.3),
]


def sampled(index, max_tokens=20, eos=None, n=1):
    return SamplingParams(max_tokens=max_tokens, seed=100 + index, eos_token_id=eos, n=n, **SAMPLED[index % 3])


def with_eos_from_alone(model, prompt, params, at=4):
    """The same knobs with eos set to the token `generate` draws at new position `at`, so the request
    really stops at an eos (at `at` or before)."""
    free_run = alone(model, prompt, params)[0]
    return SamplingParams(**{**params.__dict__, "eos_token_id": free_run[at]})


def test_seeded_samples_equal_generate_with_that_seed(model):
    prompts = prompts_of(LENGTHS, seed=2)
    requests = []
    for index, prompt in enumerate(prompts):
        params = sampled(index)
        if index % 2:
            params = with_eos_from_alone(model, prompt, params)
        requests.append((prompt, params, index))
    result, engine = serve(model, ServingConfig(num_blocks=64, max_num_seqs=5), requests)
    assert mismatches(model, result, requests) == []
    assert {"eos", "length"} <= {reason for o in result.outputs for reason in o.finish_reasons}
    assert_pool_empty(engine)


def test_preemption_recomputes_and_changes_no_token(model):
    prompts = prompts_of(LENGTHS, seed=3)
    requests = [(p, greedy(24) if i % 2 else sampled(i, 24), 0) for i, p in enumerate(prompts)]
    result, engine = serve(model, ServingConfig(num_blocks=7, max_num_seqs=8), requests)
    stats = result.stats
    assert stats.preemptions > 0 and stats.recomputed_tokens > 0
    assert stats.peak_blocks_in_use <= 7
    assert sum(o.preemptions for o in result.outputs) == stats.preemptions
    assert any(e.kind == "preemption" for o in result.outputs for e in o.events)
    assert mismatches(model, result, requests) == []
    assert_pool_empty(engine)


def test_prefix_hits_share_blocks_and_change_no_token(model):
    shared = prompts_of([40], seed=4)[0]
    tails = prompts_of((1, 5, 12, 20), seed=5)
    prompts = [shared + tail for tail in tails]
    requests = [(p, greedy(20) if i % 2 else sampled(i, 20), 2 * i) for i, p in enumerate(prompts)]
    result, engine = serve(model, ServingConfig(num_blocks=64, max_num_seqs=8), requests)
    stats = result.stats
    assert [o.cached_tokens for o in result.outputs] == [0, 32, 32, 32]  # 2 full blocks of the 40 shared tokens
    assert stats.prefix_hit_blocks == 6 and stats.prefix_hit_tokens == 96
    assert stats.blocks_saved_by_sharing == 6  # each hit was held by a running request at the time
    assert mismatches(model, result, requests) == []
    assert_pool_empty(engine)


@pytest.mark.parametrize("prompt_len, computed_again", [(33, 1), (32, 16), (48, 16)])
def test_a_prompt_wholly_cached_still_computes_its_last_block(model, prompt_len, computed_again):
    """Never the block of a prompt's last token from the cache: its logits must be computed."""
    prompt = prompts_of([prompt_len], seed=6)[0]
    requests = [(prompt, greedy(4), 0), (prompt, greedy(4), 10)]  # the second arrives after the first ended
    result, engine = serve(model, ServingConfig(num_blocks=16, max_num_seqs=2), requests)
    second = result.outputs[1]
    assert second.cached_tokens == prompt_len - computed_again
    admitted = second.events[[e.kind for e in second.events].index("admission")].step
    assert result.stats.steps[admitted - result.stats.idle_steps].prefill_tokens == computed_again
    assert mismatches(model, result, requests) == []
    assert_pool_empty(engine)


def test_chunked_prefill_under_a_token_budget_changes_no_token(model):
    prompts = prompts_of(LENGTHS, seed=7)
    requests = [(p, greedy(12) if i % 2 else sampled(i, 12), i) for i, p in enumerate(prompts)]
    config = ServingConfig(num_blocks=64, max_num_seqs=6, max_num_batched_tokens=16, chunked_prefill=True)
    result, engine = serve(model, config, requests)
    steps = result.stats.steps
    assert max(s.prefill_tokens + s.decode_tokens for s in steps) <= 16
    assert sum(s.prefill_tokens for s in steps) == sum(LENGTHS)
    assert any(s.prefill_tokens and s.decode_tokens for s in steps)
    assert mismatches(model, result, requests) == []
    assert_pool_empty(engine)


def test_n_samples_share_the_prompt_and_equal_generate_num_return_sequences(model):
    """n rows of one request are drawn together, those that drew eos included (they get eos again), as
    generate(num_return_sequences=n) draws them after torch.manual_seed(seed)."""
    prompts = prompts_of((20, 37, 48), seed=8)
    requests = []
    for index, prompt in enumerate(prompts):
        params = with_eos_from_alone(model, prompt, sampled(index, 16, n=3), at=2)
        requests.append((prompt, params, index))
    result, engine = serve(model, ServingConfig(num_blocks=40, max_num_seqs=6), requests)
    assert mismatches(model, result, requests) == []
    lengths = [len(sample) for o in result.outputs for sample in o.samples]
    assert len(set(lengths)) > 1, "every row ended together: the finished-row rule went unchecked"
    # the prompt's full blocks are held by all three rows: (3 - 1) x full blocks each
    assert result.stats.blocks_saved_by_sharing == 2 * sum(len(p) // 16 for p in prompts)
    assert_pool_empty(engine)


def test_n_samples_under_preemption_and_prefix_hits(model):
    shared = prompts_of([32], seed=9)[0]
    prompts = [shared + tail for tail in prompts_of((3, 9, 14), seed=10)]
    requests = [(p, sampled(i, 14, n=2), 0) for i, p in enumerate(prompts)]
    result, engine = serve(model, ServingConfig(num_blocks=10, max_num_seqs=6), requests)
    assert result.stats.preemptions > 0 and result.stats.prefix_hit_blocks > 0
    assert mismatches(model, result, requests) == []
    assert_pool_empty(engine)


def trace_of_varied_lengths():
    """Requests whose answers differ much in length, all arrived: a static batch waits for its longest."""
    prompts = prompts_of((10, 30, 12, 25, 8, 40, 15, 20), seed=11)
    lengths = (4, 30, 6, 24, 3, 28, 5, 18)
    return [(p, greedy(n), 0) for p, n in zip(prompts, lengths)]


def test_continuous_batching_takes_fewer_steps_than_static_with_the_same_tokens(model):
    requests = trace_of_varied_lengths()
    runs = {}
    for policy in ("static", "continuous"):
        result, engine = serve(model, ServingConfig(num_blocks=64, max_num_seqs=4, policy=policy), requests)
        assert mismatches(model, result, requests) == []
        assert_pool_empty(engine)
        runs[policy] = result.stats
    static, continuous = runs["static"], runs["continuous"]
    assert continuous.forward_steps < static.forward_steps
    assert continuous.slot_utilisation > static.slot_utilisation
    assert static.decode_tokens == continuous.decode_tokens  # the same useful work
    # static: batch 1 (4, 30, 6, 24 new tokens) runs 30 steps, batch 2 (3, 28, 5, 18) 28
    assert static.forward_steps == 30 + 28


def test_events_tell_each_request_story_in_order(model):
    requests = staggered(prompts_of((9, 30, 17), seed=12), greedy(6), every=3)
    result, _ = serve(model, ServingConfig(num_blocks=32, max_num_seqs=4), requests)
    for output, (_, _, arrival) in zip(result.outputs, requests):
        kinds = [event.kind for event in output.events]
        assert kinds == ["arrival", "admission", "first_token"] + ["token"] * 5 + ["finish"]
        steps = [event.step for event in output.events]
        times = [event.time for event in output.events]
        assert steps == sorted(steps) and times == sorted(times)
        assert output.events[0].step == arrival
        assert [e.tokens[0] for e in output.events if e.tokens] == output.samples[0]
        assert output.ttft_steps >= 0 and output.latency_s >= output.ttft_s >= 0 and output.tpot_s > 0


def test_a_request_arriving_in_seconds_waits_for_its_time(model):
    result, engine = serve(model, ServingConfig(num_blocks=16), [])
    engine.add_request(prompts_of([5])[0], greedy(3), arrival_s=0.05)
    result = engine.run()
    arrival = result.outputs[0].events[0]
    assert arrival.kind == "arrival" and arrival.time >= engine.started + 0.05
    assert result.stats.idle_steps >= 1


def test_fused_matmuls_are_counted_not_assumed(model):
    """One call for all rows of a step changes bits (a row's product depends on how many rows the call
    has); the tokens are compared all the same."""
    requests = staggered(prompts_of(LENGTHS, seed=13), greedy(12))
    result, engine = serve(model, ServingConfig(num_blocks=64, max_num_seqs=6, matmuls="fused"), requests)
    assert mismatches(model, result, requests) == []
    assert_pool_empty(engine)


def test_a_drawn_stream_is_the_same_from_the_global_and_an_own_generator():
    logits = torch.randn(3, 50)
    seen = torch.randint(0, 50, (3, 4))
    knobs = dict(temperature=0.9, top_k=10, top_p=0.9, repetition_penalty=1.2, do_sample=True)
    torch.manual_seed(5)
    global_draws = [sampling.pick(logits, seen, **knobs) for _ in range(4)]
    own = torch.Generator().manual_seed(5)
    own_draws = [sampling.pick(logits, seen, **knobs, generator=own) for _ in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(global_draws, own_draws))


def test_an_aborted_request_gives_its_blocks_back_at_once_and_changes_no_other_token(model):
    """What a server does when a client leaves: abort a request running (mid-decode, n = 2), one waiting
    and one not arrived yet; the others' tokens are still generate's alone, and the pool ends empty."""
    prompts = prompts_of((9, 21, 14, 6), seed=5)
    params = [greedy(12), SamplingParams(max_tokens=12, n=2, seed=7, eos_token_id=None, temperature=0.9),
              greedy(12), greedy(12)]
    engine = ServingEngine(model, ServingConfig(num_blocks=64, max_num_seqs=3))
    ids = [engine.add_request(prompt, p, arrival_step=step)
           for prompt, p, step in zip(prompts, params, (0, 0, 0, 50))]
    for _ in range(4):
        engine.step()
    running = engine.requests[ids[1]]
    assert running.state.value == "running" and 0 < running.num_new < 12
    assert engine.requests[ids[2]].state.value == "waiting"  # its row would make four: no slot yet
    held = engine.pool.num_used
    output = engine.abort(ids[1])
    assert engine.pool.num_used < held  # at once, before any further step
    assert output.finish_reasons == ["abort", "abort"] and len(output.samples[0]) == running.num_new
    assert engine.abort(ids[2]).samples == [[]] and engine.abort(ids[3]).samples == [[]]
    assert engine.abort(ids[1]) is None  # finished already
    result = engine.run()
    assert result.outputs[ids[0]].samples == alone(model, prompts[0], params[0])
    assert [event.kind for event in result.outputs[ids[1]].events][-1] == "abort"
    assert_pool_empty(engine)
    engine.forget(ids[0])
    assert engine.requests[ids[0]] is None and len(engine.run().outputs) == 3
