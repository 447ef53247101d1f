"""The decode benchmark (kvlab.measure.decode_bench) on a tiny model: every path's tokens against the
torch.cat path's, rows with their spread, alternating runs, the arithmetic limit under every path,
MiniMind's own generate from a file (tests/fake_minimind), the operator calls of each eager step."""
from pathlib import Path

import pytest
import torch
from torch import nn

from kvlab.engine import fast
from kvlab.engine.checkpoint import load_model, save_checkpoint
from kvlab.measure import decode_bench

from helpers import TINY_FAST, png_text, random_model, torch_threads

FAKE_MINIMIND = Path(__file__).parent / "fake_minimind" / "model_minimind.py"
PROMPT_IDS = [1, 5, 6, 7, 8, 9, 10, 11]
ROW_KEYS = {"path", "new_tokens", "ms_per_token", "q1_ms", "q3_ms", "iqr_share", "unstable", "n", "cpu_ms_per_token",
            "same_tokens_as_cat", "compile_s", "first_generation_s", "cache_length", "times_limit", "times_floor",
            "samples_s", "contended_runs", "contended"}


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as the benchmark times (the compiled step is made for a thread count)."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def tiny_and_minimind(tmp_path_factory):
    """The compiled tests' tiny model (its step compiled once per process) and MiniMind's own model
    holding its weights, built from a file as the fidelity job builds it."""
    checkpoint = tmp_path_factory.mktemp("bench") / "tiny.pth"
    save_checkpoint(random_model(0, **TINY_FAST), checkpoint)
    model = load_model(checkpoint)
    return model, decode_bench.minimind_model_for(model, checkpoint, FAKE_MINIMIND)


def test_every_path_side_by_side_with_its_spread_and_the_limit_below_all(tiny_and_minimind):
    model, minimind_model = tiny_and_minimind
    with torch_threads(2):
        result = decode_bench.decode_bench(model, PROMPT_IDS, new_tokens=(9, 4), runs=3, warmup=0, max_seconds=0,
                                           minimind_model=minimind_model)
        assert torch.get_num_threads() == 2  # one thread while timing, restored after
    assert result["torch_threads"] == 1 and result["new_tokens"] == [4, 9]
    assert result["paths"] == list(decode_bench.PATHS)
    rows = {(row["path"], row["new_tokens"]): row for row in result["rows"]}
    assert set(rows) == {(path, n) for path in decode_bench.PATHS for n in (4, 9)}
    for (path, n), row in rows.items():
        assert set(row) == ROW_KEYS
        assert row["same_tokens_as_cat"], f"{path} at {n} tokens chose other tokens"
        assert row["n"] == len(row["samples_s"]) == rows[("cat", n)]["n"] >= 3  # the same rounds for all
        assert row["q1_ms"] <= row["ms_per_token"] <= row["q3_ms"]
        assert 0 <= row["contended_runs"] <= 1 and isinstance(row["contended"], bool)
        assert (row["compile_s"] is not None) == (path == "compiled")
    # the compiled step's cache is exactly its generation's length (an aot plan): prompt + new - 1
    assert rows[("compiled", 4)]["compile_s"] >= 0 and rows[("compiled", 4)]["cache_length"] == len(PROMPT_IDS) + 4 - 1
    rate, reading = result["limit"]["matmul"], result["limit"]["read"]
    assert rate["gflops_low"] <= rate["gflops"] <= rate["gflops_high"]
    assert reading["gb_per_s_low"] <= reading["gb_per_s"] <= reading["gb_per_s_high"] and reading["bytes"] > 0
    for limit in result["limit"]["per_length"]:
        fastest = min(row["ms_per_token"] for (_, n), row in rows.items() if n == limit["new_tokens"])
        assert 0 < limit["limit_ms_per_token"] < fastest and 0 < limit["floor_ms_per_token"] < fastest
    assert all(row["times_limit"] > 1 and row["times_floor"] > 1 for row in rows.values())
    assert {(s["slow"], s["new_tokens"]) for s in result["speedups"]} == {(p, n) for p in ("cat", "minimind")
                                                                         for n in (4, 9)}
    assert all(s["low"] <= s["ratio"] <= s["high"] for s in result["speedups"])
    assert result["process"]["cpu_over_wall"] > 0


def test_extra_plans_are_rows_of_their_own_and_bad_lengths_are_refused(tiny_and_minimind):
    model, _ = tiny_and_minimind
    plan = fast.StepPlan(fused_qkv=False, fused_gate_up=False, attention="repeat_kv", compile_mode=None)
    result = decode_bench.decode_bench(model, PROMPT_IDS, new_tokens=(5,), runs=1, warmup=0, max_seconds=0,
                                       extra_plans={"unfused": plan})
    assert result["paths"] == ["cat", "static", "compiled", "plan:unfused"]
    assert all(row["same_tokens_as_cat"] for row in result["rows"])
    assert result["extra_plans"]["unfused"]["attention"] == "repeat_kv"
    with pytest.raises(ValueError, match=r"new_tokens must be positive token counts, got \[0, 3\]"):
        decode_bench.decode_bench(model, PROMPT_IDS, new_tokens=(0, 3))
    with pytest.raises(ValueError, match="runs must be at least 1, got 0"):
        decode_bench.decode_bench(model, PROMPT_IDS, new_tokens=(3,), runs=0)


def test_the_flops_count_every_matrix_product_of_the_model():
    model = random_model(0, **TINY_FAST)
    config = model.config
    weights = sum(module.weight.numel() for module in model.modules() if isinstance(module, nn.Linear))
    attention = config.num_hidden_layers * 2 * 2 * config.num_attention_heads * config.head_dim  # per position seen
    assert decode_bench.token_flops(config, 10) == 2 * weights + 10 * attention
    # a prompt of 3 and 2 new tokens: positions 1, 2, 3 in the prefill, then the first new token at 4
    assert decode_bench.generation_flops(config, 3, 2) == sum(decode_bench.token_flops(config, c) for c in (1, 2, 3, 4))


def test_the_bytes_a_step_reads_are_every_weight_once_and_the_cache_it_sees():
    model = random_model(0, **TINY_FAST)
    config = model.config
    # every parameter once: the tied embedding is the LM head, read whole, its token's row with it
    parameters = sum(p.numel() for p in model.parameters())
    cache_per_position = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    assert config.tie_word_embeddings
    assert decode_bench.token_bytes(config, 10, 4) == 4 * (parameters + 10 * cache_per_position)
    # a prompt of 3 read once with its K and V, then one step at 4 positions
    assert decode_bench.generation_bytes(config, 3, 2, 4) == (decode_bench.token_bytes(config, 3, 4)
                                                               + decode_bench.token_bytes(config, 4, 4))


def test_fewer_operator_calls_with_each_fusion():
    model = random_model(0, hidden_size=64, num_hidden_layers=2)
    plans = {"unfused": fast.StepPlan(fused_qkv=False, fused_gate_up=False, attention="repeat_kv", compile_mode=None),
             "fused": fast.StepPlan(attention="sdpa", compile_mode=None)}
    calls = decode_bench.operator_calls(model, PROMPT_IDS, plans)
    assert calls["fused"] < calls["unfused"] < calls["cat"] < calls["static"]
    with pytest.raises(ValueError, match="operator_calls: plan 'compiled' is compiled; count eager plans only"):
        decode_bench.operator_calls(model, PROMPT_IDS, {"compiled": fast.StepPlan()})


def test_the_rule_is_built_only_when_asked_and_its_figure_reads_its_rows(tmp_path):
    """rule all leaves decode_bench out (compiling costs the cold build tens of seconds); asked for, it
    needs only the checkpoint and the prompt. Its figure draws every path and the limit in both languages."""
    from helpers import dry_run_jobs
    from kvlab.present import beyond_figures

    assert "decode_bench" not in dry_run_jobs(tmp_path)
    assert dry_run_jobs(tmp_path, "results/decode_bench.csv") == {
        "corpus": 1, "tokenizer": 1, "pretrain": 1, "prompt": 1, "inspect_checkpoint": 1, "decode_bench": 1}
    rows = [{"path": path, "new_tokens": n, "ms_per_token": ms, "q1_ms": 0.9 * ms, "q3_ms": 1.1 * ms,
             "times_limit": 10.0 * ms / 4.0, "times_floor": 5.0 * ms / 4.0, "prompt_len": 201}
            for path, ms in (("cat", 4.0), ("static", 3.8), ("compiled", 0.8), ("minimind", 4.2)) for n in (64, 1024)]
    for language in ("en", "ko"):
        beyond_figures.decode_bench(rows, tmp_path / f"decode_{language}.png", language=language)
        described = png_text(tmp_path / f"decode_{language}.png")["Description"]
        assert described.count("\n") >= 6  # four paths, the limit, the floor, the axes
    assert "MiniMind's own generate" in png_text(tmp_path / "decode_en.png")["Description"]
    assert "MiniMind 자체의 generate" in png_text(tmp_path / "decode_ko.png")["Description"]
