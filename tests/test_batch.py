"""Many requests at once: left padding with MiniMind's attention mask, llama-batched-bench's table, the
four ways of reserving a cache, their report section; and the two jobs in the built workflow."""
import copy
import csv
import json
import math

import pytest
import torch

from kvlab.engine.model import left_pad
from kvlab.io import read_csv_rows
from kvlab.facts.budget import KEPT_RUNGS, Budget
from kvlab.measure import batch, kv_waste, prompt
from kvlab.present.beyond import batch_context, kv_waste_context
from kvlab.measure.steps import GREEDY_NO_EOS

from helpers import course_config, dry_run_jobs, random_model


def prompts_of(lengths, seed=1, vocab=300):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]


# --- the engine: left padding and the attention mask --------------------------------------------


def test_left_pad_puts_padding_on_the_left_with_a_zero_mask():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    with pytest.raises(ValueError, match="no empty one"):
        left_pad([[5], []])


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("flash", [False, True])
def test_padded_rows_generate_what_each_prompt_gives_alone(use_cache, flash):
    model = random_model(5)
    for layer in model.model.layers:
        layer.self_attn.use_flash = flash  # a padded prefill must leave the flash path for the mask
    prompts = prompts_of((5, 17, 9, 1))
    ids, mask = left_pad(prompts)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=15, use_cache=use_cache, **GREEDY_NO_EOS)
    for row, row_ids in enumerate(prompts):
        alone = model.generate(torch.tensor([row_ids]), max_new_tokens=15, **GREEDY_NO_EOS)[0, len(row_ids):]
        assert torch.equal(out[row, ids.shape[1]:], alone), f"row {row} (prompt of {len(row_ids)} tokens)"
    assert len(set(out[1, ids.shape[1]:].tolist())) > 1, "degenerate output would make the check weak"


def test_without_the_mask_padding_changes_the_answer():
    """The mask is what makes padding harmless: the same padded batch without it attends to the pads."""
    model = random_model(6)
    prompts = prompts_of((3, 20), seed=2)
    ids, mask = left_pad(prompts)
    with torch.inference_mode():
        masked = model(ids, attention_mask=mask).logits[0, -1]
        unmasked = model(ids).logits[0, -1]
        alone = model(torch.tensor([prompts[0]])).logits[0, -1]
    torch.testing.assert_close(masked, alone, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(unmasked, alone, rtol=1e-3, atol=1e-3)


def test_a_mask_of_another_shape_is_refused():
    model = random_model(0)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        model.generate(torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 2, dtype=torch.long), max_new_tokens=2)


# --- batch: llama-batched-bench's table ---------------------------------------------------------


@pytest.fixture(scope="module")
def bench():
    model = random_model(7)
    distinct = [[1] + prompt for prompt in prompts_of((6, 11, 3, 9), seed=3)]
    rows, runs = batch.batch_bench(model, [1] + prompts_of((11,), seed=4)[0], distinct, new_tokens=5,
                                     sizes=[4, 1, 2], warmup=0, repeats=2, max_seconds=0.0,
                                     memory_limit_gib=1, device="cpu")
    return model, distinct, rows, runs


def test_batch_rows_follow_llama_batched_bench(bench):
    model, distinct, rows, _ = bench
    assert [(row["mode"], row["B"]) for row in rows] == [(m, b) for m in ("shared", "distinct") for b in (1, 2, 4)]
    per_token = model.config.kv_bytes_per_token("float32")
    for row in rows:
        assert list(row)[1:11] == list(batch.BENCH_COLUMNS)
        assert row["N_KV"] == row["B"] * (row["PP"] + row["TG"])
        assert row["kv_bytes_measured"] == row["kv_bytes_formula"] == row["N_KV"] * per_token
        assert row["S_TG t/s"] == pytest.approx(row["B"] * row["TG"] / row["T_TG s"])
        assert row["S_PP t/s"] == pytest.approx(row["B"] * row["PP"] / row["T_PP s"])
        assert row["S t/s"] == pytest.approx(row["N_KV"] / row["T s"])
        assert row["S_TG_low"] <= row["S_TG t/s"] <= row["S_TG_high"]
        assert row["same_as_single"] is True
    distinct_rows = [row for row in rows if row["mode"] == "distinct"]
    # the first B prompts, padded to the longest of them
    assert [row["PP"] for row in distinct_rows] == [7, 12, 12]
    assert [row["pad"] for row in distinct_rows] == [0, 5, 5 + 8 + 2]
    assert [row["PP"] for row in rows if row["mode"] == "shared"] == [12, 12, 12]
    # the gain is over the smallest B of the same mode
    assert distinct_rows[0]["S_TG_gain"] == 1.0


def test_batch_runs_keep_every_sample(bench):
    _, _, rows, runs = bench
    detail = runs["by_mode_and_size"]["distinct 4"]
    assert len(detail["decode_s"]) == len(detail["prefill_s"]) == 2 == rows[-1]["runs"]
    assert rows[-1]["T_TG s"] == pytest.approx(sorted(detail["decode_s"])[0] / 2 + sorted(detail["decode_s"])[1] / 2)
    assert detail["rows_differing"] == []
    assert {"device", "processor", "torch_threads"} <= set(runs)
    # each run's clocks, and the contention they show, judged on the CPU
    assert len(detail["usage"]["thread_cpu_s"]) == 2 and detail["decode"]["contention"] == "judged"
    assert rows[-1]["contended"] == detail["decode"]["contended"] and rows[-1]["cpu_share"] == detail["decode"]["cpu_share"]


def test_a_batch_whose_cache_exceeds_the_limit_stops_before_any_work():
    model = random_model(0)
    limit_gib = 10 * (2 + 3) * model.config.kv_bytes_per_token("float32") / 2**30  # room for B = 10
    assert batch.check_batch_memory(model, 2, 3, [1, 10], limit_gib) == model.config.kv_bytes_per_token("float32")
    with pytest.raises(ValueError, match=r"config key 'extras.batch.sizes': B = 11 needs a cache of .* more than "
                                         r"extras.batch.memory_limit_gib"):
        batch.check_batch_memory(model, 2, 3, [1, 11], limit_gib)


def test_too_few_documents_name_the_file_and_the_key(tokenizer_dir):
    from kvlab.engine.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(tokenizer_dir)
    texts = ["민수는 시장에 갔다.", "", "가람 마을의 특산물은 배입니다."]
    prompts = prompt.document_prompts(tokenizer, texts, 2, cap=4, share=0.5)
    assert all(prompt[0] == tokenizer.bos_id and 2 <= len(prompt) <= 4 for prompt in prompts)
    with pytest.raises(ValueError, match=r"^val.jsonl: 2 non-empty documents, config key 'extras.batch.sizes' needs 3$"):
        prompt.document_prompts(tokenizer, texts, 3, cap=4, source="val.jsonl", key="extras.batch.sizes")


# --- kv_waste: four ways of reserving ----------------------------------------------------------


def test_reserved_slots_of_each_policy():
    assert [kv_waste.reserved_slots("power_of_two", held, 40, 256, 16) for held in (1, 2, 3, 16, 17)] == [1, 2, 4, 16, 32]
    assert [kv_waste.reserved_slots("blocks", held, 40, 256, 16) for held in (1, 16, 17, 32, 33)] == [16, 16, 32, 32, 48]
    assert kv_waste.reserved_slots("exact", 3, 40, 256, 16) == 40
    assert kv_waste.reserved_slots("max_length", 3, 40, 256, 16) == 256


def test_a_request_split_adds_up_as_the_paper_splits():
    # prompt 10, final 20: ten moments holding 11..20 tokens, 15.5 on average
    split = kv_waste.request_split(10, 20, max_length=64, block_tokens=16)
    for policy in kv_waste.POLICIES:
        parts = split[policy]
        assert parts["token"] == 15.5
        assert parts["reserved"] == pytest.approx(parts["token"] + parts["reservation"] + parts["internal_fragmentation"])
    assert split["exact"] == {"reserved": 20, "token": 15.5, "reservation": 4.5, "internal_fragmentation": 0, "peak": 20}
    assert split["max_length"]["internal_fragmentation"] == 44 and split["max_length"]["peak"] == 64
    # blocks: 16 slots while holding 11..16 (6 moments), 32 for 17..20 (4), of which 12 are beyond 20
    assert split["blocks"]["reserved"] == (6 * 16 + 4 * 32) / 10
    assert split["blocks"]["internal_fragmentation"] == 4 * 12 / 10
    assert split["blocks"]["peak"] == 32


def test_kv_waste_rows_from_real_sampled_requests():
    model = random_model(8)
    prompts = [[1] + prompt for prompt in prompts_of((4, 9, 2, 6, 12), seed=5)]
    rows, detail = kv_waste.kv_waste(model, prompts, prompt_cap=13, answer_cap=7, temperature=1.0, top_p=0.9, seed=0,
                                    eos_id=2, block_tokens=4, budgets_gib=[0.001, 1], device="cpu")
    per_token = model.config.kv_bytes_per_token("float32")
    assert detail["bytes_per_token"] == per_token  # weighed from the generation's real cache
    requests = detail["requests"]
    assert [r["prompt_len"] for r in requests] == [len(p) for p in prompts]
    assert all(1 <= r["answer_len"] <= 7 and r["final_len"] == r["prompt_len"] + r["answer_len"] for r in requests)
    by_policy = {row["policy"]: row for row in rows}
    assert list(by_policy) == list(kv_waste.POLICIES)
    tokens = {row["token_bytes"] for row in rows}
    assert len(tokens) == 1, "every policy holds the same tokens"
    for row in rows:
        assert row["reserved_bytes"] == pytest.approx(
            row["token_bytes"] + row["reservation_bytes"] + row["internal_fragmentation_bytes"])
        assert row["token_share"] + row["reservation_share"] + row["internal_fragmentation_share"] == pytest.approx(1)
        assert row["fits_1gib"] == math.floor(2**30 / (row["peak_reserved_bytes"] / len(prompts)))
    assert by_policy["max_length"]["peak_reserved_bytes"] == len(prompts) * 20 * per_token
    assert by_policy["exact"]["internal_fragmentation_bytes"] == 0
    assert by_policy["exact"]["peak_reserved_bytes"] == sum(r["final_len"] for r in requests) * per_token
    assert by_policy["max_length"]["fits_1gib"] <= by_policy["blocks"]["fits_1gib"] <= by_policy["exact"]["fits_1gib"]



def test_kv_waste_answers_only_the_requests_its_budget_predicts_to_fit():
    model = random_model(8)
    prompts = [[1] + prompt for prompt in prompts_of((4, 9, 2, 6, 12, 5, 7, 3, 8, 4), seed=5)]
    settings = dict(prompt_cap=13, answer_cap=7, temperature=1.0, top_p=0.9, seed=0, eos_id=2, block_tokens=4,
                    budgets_gib=[1], device="cpu")
    whole, detail = kv_waste.kv_waste(model, prompts, **settings)
    assert detail["requests_asked"] == 10 and detail["budget"] == {"budget_s": None, "cut": []}
    roomy, roomy_detail = kv_waste.kv_waste(model, prompts, **settings, budget=Budget(3600))
    assert roomy == whole and roomy_detail["requests"] == detail["requests"]  # the probe leaves the answers alone
    tight, tight_detail = kv_waste.kv_waste(model, prompts, **settings, budget=Budget(1e-9))
    assert [row["requests"] for row in tight] == [KEPT_RUNGS] * len(kv_waste.POLICIES)
    assert tight_detail["requests"] == detail["requests"][:KEPT_RUNGS]  # the first ones, sampled as before
    [cut] = tight_detail["budget"]["cut"]
    assert cut["rung"] == f"requests {KEPT_RUNGS + 1}-10" and cut["predicted_s"] > 0
    context = kv_waste_context(tight, tight_detail)
    assert context["cut"] == [cut] and context["budget_s"] == 1e-9

# --- the report's sentences come from the numbers ------------------------------------------------


def bench_rows(speeds, steps, mode="shared"):
    """Rows of batch.tsv for B = 1, 2, 4, ... with S_TG `speeds` (each ± 5%) and ms per step `steps`."""
    rows = []
    for index, (speed, step) in enumerate(zip(speeds, steps)):
        rows.append({"mode": mode, "B": 2**index, "PP": 10, "pad": 0, "S_TG t/s": speed, "S_TG_low": speed * 0.95,
                     "S_TG_high": speed * 1.05, "ms_per_step": step, "S_TG_gain": speed / speeds[0],
                     "S_TG_gain_low": speed * 0.95 / (speeds[0] * 1.05), "S_TG_gain_high": speed * 1.05 / (speeds[0] * 0.95),
                     "same_as_single": True, "kv_bytes_measured": 1, "kv_bytes_formula": 1})
    return rows


def test_where_the_throughput_stops_growing_is_read_from_the_intervals():
    # clear growth to B = 4, then the intervals meet; a step's time then grows with the rows
    context = batch_context(bench_rows([100, 190, 370, 380], [1.0, 1.05, 1.08, 2.1]))
    mode = context["modes"]["shared"]
    assert mode["grows_to"]["B"] == 4 and not mode["still_growing"]
    assert mode["gain"] == "above" and mode["row_bound"]
    assert mode["step_after"] == pytest.approx(2.1 / 1.08)
    growing = batch_context(bench_rows([100, 190, 370, 700], [1.0, 1.05, 1.08, 1.1]))["modes"]["shared"]
    assert growing["still_growing"] and growing["grows_to"]["B"] == 8
    flat = batch_context(bench_rows([100, 101], [1.0, 1.98]))["modes"]["shared"]
    assert flat["gain"] == "within" and flat["grows_to"]["B"] == 1


def test_kv_waste_context_checks_every_request_adds_up():
    rows = [{"policy": policy, "fits_24gib": fits} for policy, fits in
            zip(kv_waste.POLICIES, (10, 40, 70, 60))]
    detail = {"requests": [{"prompt_len": 3, "answer_len": 2, "final_len": 5, "eos": True,
                            "slots": kv_waste.request_split(3, 5, 20, 4)}],
              "budgets_gib": [24], "bytes_per_token": 8.0, "max_length": 20, "block_tokens": 4, "answer_cap": 4}
    context = kv_waste_context(copy.deepcopy(rows), detail)
    assert context["adds_up"] and context["fits_gain"] == 6.0 and context["at_eos"] == 1
    detail["requests"][0]["slots"]["blocks"]["reservation"] += 1
    assert not kv_waste_context(copy.deepcopy(rows), detail)["adds_up"]


# --- the jobs in the built workflow -------------------------------------------------------------


def test_the_build_writes_batch_and_kv_waste(course_build):
    results = course_build / "results"
    with open(results / "batch.tsv", encoding="utf-8") as f:
        header = next(csv.reader(f, delimiter="\t"))
    assert header[1:11] == list(batch.BENCH_COLUMNS)
    rows = read_csv_rows(results / "batch.tsv")
    assert [(row["mode"], row["B"]) for row in rows] == [(m, b) for m in ("shared", "distinct") for b in (1, 2, 4)]
    assert all(row["same_as_single"] is True for row in rows)
    assert all(row["kv_bytes_measured"] == row["kv_bytes_formula"] for row in rows)
    waste = read_csv_rows(results / "kv_waste.csv")
    assert [row["policy"] for row in waste] == list(kv_waste.POLICIES)
    requests = json.loads((results / "kv_waste_requests.json").read_text(encoding="utf-8"))
    assert len(requests["requests"]) == 6
    beyond = (results / "beyond.md").read_text(encoding="utf-8")
    assert "## 여러 요청을 한꺼번에" in beyond and "## 캐시를 어떻게 잡는가" in beyond
    # the largest batch's throughput as the report judges it: on the CPU clock when a batch was contended
    runs = json.loads((results / "batch_runs.json").read_text(encoding="utf-8"))
    largest = batch_context(rows, runs)["modes"]["distinct"]["rows"][-1]
    assert f"| {largest['B']} | " in beyond and f"{largest['shown']['value']:,.0f} (" in beyond
    report = beyond
    blocks = next(row for row in waste if row["policy"] == "blocks")
    assert f"{blocks['token_share'] * 100:.1f}%" in report
    assert (results / "figures" / "batch.png").stat().st_size > 10_000


def test_changing_the_batch_sizes_reruns_only_batch_and_its_readers(course_build, course):
    config = course_config(course)
    config["extras"] = {**config["extras"], "batch": {**config["extras"]["batch"], "sizes": [1, 3]}}
    # the sheet's report reads no result beyond the sheet: neither it nor check (which reads it) reruns
    assert dry_run_jobs(course_build, config=config) == {"batch": 1, "figure_batch": 1, "beyond": 1,
                                                         "lab_report": 1, "explore": 1, "all": 1}


def test_batch_alone_runs_only_its_ancestors(tmp_path, course):
    jobs = dry_run_jobs(tmp_path, "results/batch.tsv", config=course_config(course))
    assert jobs == {"inspect_checkpoint": 1, "prompt": 1, "batch": 1}
