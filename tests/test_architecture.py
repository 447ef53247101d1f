"""Never silently wrong on a user's own files: each layout's own defaults, the source of every config
field, the head count of a MiniMind2 file stated, measured or refused, and a tokenizer that does not
belong to the checkpoint caught before any job runs."""
import json

import pytest
import torch

from kvlab.default_model.bpe import train_tokenizer
from kvlab.default_model.corpus import write_corpus
from kvlab.default_model.train import build_model, pretrain
from kvlab.engine.architecture import OVERRIDE_KEY, head_count_candidates, measure_head_count
from kvlab.engine.checkpoint import CheckpointError, load_model, read_state_dict, save_checkpoint
from kvlab.engine.data import read_texts
from kvlab.engine.tokenizer import load_tokenizer, vocab_mismatch

from helpers import course_config, model_jobs_run, random_model, snakemake

MINIMIND2 = dict(hidden_size=64, num_hidden_layers=2, num_key_value_heads=2, qk_norm=False, rms_norm_eps=1e-5)


@pytest.fixture(scope="module")
def minimind2_course(tmp_path_factory):
    """A course folder with MiniMind2-layout checkpoints (no q_norm/k_norm, float16) trained by kvlab's own
    code with 4 and with 8 heads, their tokenizer and validation text; plus a random-weight one."""
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("minimind2")
    corpus = {k: folder / f"{k}.jsonl" for k in ("pretrain_train", "pretrain_val", "sft")}
    write_corpus(corpus, seed=0, train_docs=300, val_docs=20, sft_examples=10)
    train_tokenizer([corpus["pretrain_train"]], 600, folder / "tokenizer")
    tokenizer = load_tokenizer(folder / "tokenizer")
    train, val = read_texts(corpus["pretrain_train"]), read_texts(corpus["pretrain_val"])
    files = {}
    for heads in (4, 8):
        model = build_model(tokenizer.vocab_size, 0, num_attention_heads=heads, max_position_embeddings=256,
                            **MINIMIND2)
        pretrain(model, tokenizer, train, val, steps=200, batch_size=16, seq_len=64, lr=0.01, seed=0)
        files[heads] = folder / f"minimind2_{heads}heads.pth"
        save_checkpoint(model, files[heads])
    files["random"] = folder / "minimind2_random.pth"
    save_checkpoint(build_model(tokenizer.vocab_size, 1, num_attention_heads=4, max_position_embeddings=256,
                                **MINIMIND2), files["random"])
    return {"files": files, "tokenizer": folder / "tokenizer", "val_data": corpus["pretrain_val"]}


def course_with(course, checkpoint, **extra):
    files = {"pretrain": checkpoint, "sft": checkpoint, "tokenizer": course["tokenizer"],
             "val_data": course["val_data"]}
    return {**course_config(files), **extra}


# --- the engine: layouts, defaults and sources --------------------------------------------------


def test_minimind3_file_reads_its_shapes_and_takes_its_layouts_eps(tmp_path):
    save_checkpoint(random_model(0, rms_norm_eps=1e-5), tmp_path / "m3.pth")  # eps is not in the file
    model = load_model(tmp_path / "m3.pth")
    architecture = model.architecture
    assert architecture.layout == "minimind-3"
    assert model.config.rms_norm_eps == 1e-6 and architecture.sources["rms_norm_eps"] == "layout default"
    assert architecture.sources["num_attention_heads"] == "file" and model.config.num_attention_heads == 4
    assert architecture.sources["hidden_size"] == "file"


def test_minimind2_file_uses_eps_1e5_and_says_where_each_field_came_from(tmp_path):
    save_checkpoint(random_model(0, num_attention_heads=4, **MINIMIND2), tmp_path / "m2.pth")
    model = load_model(tmp_path / "m2.pth", num_attention_heads=4)
    assert model.architecture.layout == "MiniMind2"
    assert model.config.rms_norm_eps == 1e-5
    assert all(norm.eps == 1e-5 for norm in [model.model.norm] + [b.input_layernorm for b in model.model.layers])
    sources = model.architecture.sources
    assert sources["num_attention_heads"] == "user" and sources["rms_norm_eps"] == "layout default"
    assert sources["vocab_size"] == "file" and sources["num_key_value_heads"] == "user"
    stated = load_model(tmp_path / "m2.pth", num_attention_heads=4, rms_norm_eps=1e-6)
    assert stated.config.rms_norm_eps == 1e-6 and stated.architecture.sources["rms_norm_eps"] == "user"


def test_minimind2_file_without_a_head_count_is_refused_not_guessed(tmp_path):
    save_checkpoint(random_model(0, num_attention_heads=4, **MINIMIND2), tmp_path / "m2.pth")
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path / "m2.pth")
    message = str(err.value)
    assert "m2.pth" in message and OVERRIDE_KEY in message and "[2, 4, 8]" in message


def test_a_head_count_that_contradicts_the_tensors_is_refused(tmp_path):
    save_checkpoint(random_model(0), tmp_path / "m3.pth")  # 4 heads of 32, read off q_norm
    with pytest.raises(CheckpointError, match="num_attention_heads=8 contradicts"):
        load_model(tmp_path / "m3.pth", num_attention_heads=8)


def test_head_count_candidates_follow_the_shapes():
    state_dict = random_model(0, num_attention_heads=8, **MINIMIND2).state_dict()  # q 64 rows, k 2 x 8 = 16
    assert head_count_candidates(state_dict) == [4, 8]


@pytest.mark.parametrize("heads", [4, 8])
def test_measurement_finds_the_true_head_count_of_a_trained_model(minimind2_course, heads):
    tokenizer = load_tokenizer(minimind2_course["tokenizer"])
    windows = [([tokenizer.bos_id] + tokenizer.encode(text))[:64] for text in read_texts(minimind2_course["val_data"], 6)]
    result = measure_head_count(read_state_dict(minimind2_course["files"][heads]), windows)
    assert result["chosen"] == heads, result["reason"]
    assert set(result["losses"]) == set(head_count_candidates(read_state_dict(minimind2_course["files"][heads])))


def test_measurement_gives_no_winner_for_random_weights(minimind2_course):
    tokenizer = load_tokenizer(minimind2_course["tokenizer"])
    windows = [([tokenizer.bos_id] + tokenizer.encode(text))[:64] for text in read_texts(minimind2_course["val_data"], 6)]
    result = measure_head_count(read_state_dict(minimind2_course["files"]["random"]), windows)
    assert result["chosen"] is None and "no clear winner" in result["reason"]


def test_vocab_mismatch_rule():
    assert vocab_mismatch(400, 400) is None and vocab_mismatch(400, 512) is None  # padding to 128
    assert "only vocab_size=300" in vocab_mismatch(400, 300)
    assert "far more" in vocab_mismatch(1884, 6400)


# --- the workflow: measured, stated or stopped before any job ------------------------------------


@pytest.mark.parametrize("heads", [4, 8])
def test_workflow_measures_the_head_count_and_says_so(tmp_path, minimind2_course, heads):
    config = course_with(minimind2_course, minimind2_course["files"][heads])
    snakemake(tmp_path, "results/kvbytes.json", "results/model_card.json", config=config)
    inspection = json.loads((tmp_path / "results" / "checkpoints" / "pretrain.json").read_text())
    assert inspection["head_count"]["chosen"] == heads and inspection["sources"]["num_attention_heads"] == "measured"
    assert inspection["tokenizer"]["fits"] is True and inspection["config"]["head_dim"] == 64 // heads
    kv = json.loads((tmp_path / "results" / "kvbytes.json").read_text())
    assert kv["k_shape"][2:] == [2, 64 // heads]  # 2 KV heads of head_dim 64 / heads
    card = json.loads((tmp_path / "results" / "model_card.json").read_text())
    pretrain = card["models"]["pretrain"]
    assert pretrain["layout"] == "MiniMind2"
    assert pretrain["config"]["num_attention_heads"] == heads and pretrain["sources"]["num_attention_heads"] == "measured"
    assert pretrain["config"]["rms_norm_eps"] == 1e-5 and pretrain["sources"]["rms_norm_eps"] == "layout default"
    assert pretrain["head_count"]["chosen"] == heads and f"{heads} heads: the lowest loss" in pretrain["head_count"]["reason"]
    assert card["warnings"] == [] and card["prompt_perplexity"]["perplexity"] < 50
    log = (tmp_path / "results" / "logs" / "kvbytes.log").read_text(encoding="utf-8")
    assert f"num_attention_heads': '{heads} (measured)" in log


def test_workflow_stops_before_any_model_job_when_the_head_count_cannot_be_measured(tmp_path, minimind2_course):
    config = course_with(minimind2_course, minimind2_course["files"]["random"])
    result = snakemake(tmp_path, "results/kvbytes.json", config=config, check=False)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    lines = [line for line in output.splitlines() if OVERRIDE_KEY in line]
    assert len(lines) == 1 and "no clear winner" in lines[0] and "minimind2_random.pth" in lines[0]
    assert "kvlab error in rule inspect_checkpoint" in lines[0] and "Traceback" not in output
    assert model_jobs_run(tmp_path) == set()  # no model job ran
    assert not (tmp_path / "results" / "checkpoints" / "pretrain.json").exists()


def test_workflow_uses_a_stated_head_count(tmp_path, minimind2_course):
    config = course_with(minimind2_course, minimind2_course["files"]["random"],
                         model_overrides={"num_attention_heads": 4})
    snakemake(tmp_path, "results/kvbytes.json", config=config)
    assert json.loads((tmp_path / "results" / "kvbytes.json").read_text())["k_shape"][2:] == [2, 16]


def test_a_tokenizer_that_does_not_belong_is_caught_before_any_model_job(tmp_path, minimind2_course):
    big = tmp_path / "big_vocab.pth"
    save_checkpoint(random_model(0, vocab_size=6400), big)
    files = {"pretrain": big, "sft": big, "tokenizer": minimind2_course["tokenizer"],
             "val_data": minimind2_course["val_data"]}
    result = snakemake(tmp_path, "results/topp.json", config=course_config(files), check=False)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    line = next(line for line in output.splitlines() if "do not belong together" in line)
    assert "big_vocab.pth" in line and "vocab_size=6400" in line and "Traceback" not in output
    assert model_jobs_run(tmp_path) == set()


def test_a_compared_minimind2_checkpoint_gets_its_head_count_measured_too(tmp_path, minimind2_course):
    files = minimind2_course["files"]
    config = {**course_with(minimind2_course, files[8]),
              "compare": [{"name": "four-heads", "checkpoint": str(files[4])}]}
    snakemake(tmp_path, "results/compare.csv", config=config)
    inspection = json.loads((tmp_path / "results" / "checkpoints" / "four-heads.json").read_text())
    assert inspection["head_count"]["chosen"] == 4 and inspection["sources"]["num_attention_heads"] == "measured"
    heads = {name: json.loads((tmp_path / "results" / "compare" / name / "cost.json").read_text())["heads"]
             for name in ("lab", "four-heads")}
    assert heads == {"lab": 8, "four-heads": 4}
