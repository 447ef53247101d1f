"""Bad input, faults and safety: one-line errors naming the key or file, nothing half-written left."""
import json
import os
import shutil
import signal
import subprocess
import time

import pytest
import torch

from kvlab.config import load_schema, typed_by_schema
from kvlab.engine.checkpoint import CheckpointError, load_model, save_checkpoint
from kvlab.engine.data import DataError, read_texts
from kvlab.engine.tokenizer import load_tokenizer
from kvlab.io import write_json_atomic
from kvlab.measure.prompt import make_prompt

from helpers import ROOT, course_config, model_jobs_run, random_model, snakemake, snakemake_cmd

RESULT_NAMES = ["prompt", "same", "count", "time", "kvbytes", "temp", "topp"]


def error_line(result, needle):
    """The single output line that carries the message (and assert there is one)."""
    text = result.stdout + result.stderr
    lines = [line for line in text.splitlines() if needle in line]
    assert lines, f"no line with {needle!r} in:\n{text[-3000:]}"
    return lines[0]


def assert_no_results(workdir, names=RESULT_NAMES):
    for name in names:
        assert not (workdir / "results" / f"{name}.json").exists(), name


# --- config: refused by the schema before any job runs -------------------------------------

BAD_CONFIGS = [
    ({"colour": "blue"}, "'colour' was unexpected"),
    ({"lab": {"tempo": {}}}, "'tempo' was unexpected"),
    ({"device": 3}, "config key 'device'"),
    ({"lab": {"temp": {"temperatures": [0.3, 0]}}}, "config key 'lab.temp.temperatures.1'"),
    ({"lab": {"temp": {"temperatures": [-1.0]}}}, "config key 'lab.temp.temperatures.0'"),
    ({"lab": {"topp": {"ps": [0.5, 1.5]}}}, "config key 'lab.topp.ps.1'"),
    ({"lab": {"topp": {"ps": [0]}}}, "config key 'lab.topp.ps.0'"),
    ({"lab": {"prompt": {"cut_tokens": 0}}}, "config key 'lab.prompt.cut_tokens'"),
    ({"lab": {"same": {"new_tokens": 0}}}, "config key 'lab.same.new_tokens'"),
    ({"lab": {"temp": {"samples": 0}}}, "config key 'lab.temp.samples'"),
    ({"lab": {"prompt": {"n_docs": 0}}}, "config key 'lab.prompt.n_docs'"),
    ({"lab": {"time": {"repeats": "three"}}}, "config key 'lab.time.repeats'"),
]


@pytest.mark.parametrize("config,needle", BAD_CONFIGS)
def test_bad_config_is_refused_before_any_job(tmp_path, config, needle):
    result = snakemake(tmp_path, "-n", config=config, check=False)
    assert result.returncode != 0
    line = assert_one_line_alone(result, needle)
    assert "config" in line
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("value, needle", [
    ('lab={"topp": {"ps": [0.5, 0.99]}}', None),  # as the configuration page prints it
    ('lab={"topp": {"ps": [0.5, 1.5]}}', "config key 'lab.topp.ps.1': 1.5 is greater than the maximum of 1"),
    ('lab={"time": {"repeats": "three"}}', "config key 'lab.time.repeats': 'three' is not of type 'integer'"),
])
def test_nested_command_line_values_keep_their_types(tmp_path, value, needle):
    """--config reads a nested value with YAML's base loader, every number a string: the workflow
    gives them back the types the schema asks for before checking them."""
    result = subprocess.run([*snakemake_cmd(tmp_path, "-n", "results/topp.json"), "--config", value],
                            capture_output=True, text=True, cwd=tmp_path)
    if needle is None:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    else:
        assert result.returncode != 0 and assert_one_line_alone(result, needle)


def test_typed_by_schema_changes_only_what_the_schema_does_not_allow_as_text():
    schema = load_schema(ROOT / "schemas" / "config.schema.yaml")
    given = {"lab": {"topp": {"ps": ["0.5", "1"], "prefix": "0.5"}, "temp": {"question": "1.0"}},
             "pretrain": "null", "compare": [{"name": "7", "architecture": {"hidden_size": "64"}}]}
    assert typed_by_schema(given, schema) == {
        "lab": {"topp": {"ps": [0.5, 1], "prefix": "0.5"}, "temp": {"question": "1.0"}},
        "pretrain": "null", "compare": [{"name": "7", "architecture": {"hidden_size": 64}}]}


def assert_one_line_alone(result, needle):
    """The run stopped with the line that names the problem and nothing else: no traceback, no
    Snakemake exception dump (Snakemake's note that --configfile extends config.yaml may precede)."""
    line = error_line(result, needle)
    lines = [text for text in (result.stdout + result.stderr).splitlines()
             if text.strip() and "is extended by additional config" not in text]
    assert lines == [line], "\n".join(lines)
    return line


@pytest.mark.parametrize("key", ["pretrain", "sft", "val_data", "tokenizer"])
@pytest.mark.parametrize("flag", ["-n", "--rulegraph"])
def test_missing_configured_path_names_key_and_path(tmp_path, course, key, flag):
    """Checked once, before the DAG: the tokenizer folder too (its files come from an input function,
    whose error Snakemake would wrap in an InputFunctionException with a traceback)."""
    config = course_config(course)
    config[key] = str(tmp_path / "nowhere" / "file")
    result = snakemake(tmp_path, flag, config=config, check=False)
    assert result.returncode != 0
    line = assert_one_line_alone(result, f"config key '{key}'")
    assert line.startswith(f"config key '{key}'") and str(tmp_path / "nowhere") in line
    assert not (tmp_path / "results").exists()


def test_tokenizer_folder_without_tokenizer_json(tmp_path, course):
    config = course_config(course)
    config["tokenizer"] = str(tmp_path)  # a folder, but not a tokenizer's
    result = snakemake(tmp_path, "-n", config=config, check=False)
    assert result.returncode != 0
    line = assert_one_line_alone(result, "config key 'tokenizer'")
    assert f"{tmp_path} is not a folder with a tokenizer.json" in line


def test_missing_folder_to_check_names_key_and_path(tmp_path, course):
    config = course_config(course)
    config["extras"] = {**config["extras"], "check": {"results_dir": str(tmp_path / "student")}}
    result = snakemake(tmp_path, "-n", "check", config=config, check=False)
    assert result.returncode != 0
    line = assert_one_line_alone(result, "config key 'extras.check.results_dir'")
    assert str(tmp_path / "student") in line


# --- checkpoints -------------------------------------------------------------------------------

def test_not_a_torch_file(tmp_path):
    path = tmp_path / "notes.pth"
    path.write_text("these are my notes, not weights")
    with pytest.raises(CheckpointError, match=r"notes\.pth: not a loadable PyTorch state_dict"):
        load_model(path)


def test_truncated_checkpoint(tmp_path):
    save_checkpoint(random_model(), tmp_path / "full.pth")
    data = (tmp_path / "full.pth").read_bytes()
    (tmp_path / "cut.pth").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"cut\.pth: not a loadable PyTorch state_dict"):
        load_model(tmp_path / "cut.pth")


def test_other_architecture_names_first_mismatch(tmp_path):
    save_checkpoint(random_model(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32), tmp_path / "a.pth")
    # same names, but a tensor shaped for a different model
    state = torch.load(tmp_path / "a.pth", weights_only=True)
    state["model.layers.0.self_attn.v_proj.weight"] = torch.zeros(64, 64, dtype=torch.float16)
    torch.save(state, tmp_path / "b.pth")
    with pytest.raises(CheckpointError, match=r"b\.pth: tensor model\.layers\.0\.self_attn\.v_proj\.weight has shape \(64, 64\), the architecture expects \(32, 64\)"):
        load_model(tmp_path / "b.pth")


def test_missing_and_unexpected_keys_are_listed(tmp_path):
    state = random_model().state_dict()
    del state["model.layers.3.mlp.up_proj.weight"]
    state["model.layers.0.mlp.extra.weight"] = torch.zeros(2)
    torch.save(state, tmp_path / "odd.pth")
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path / "odd.pth")
    message = str(err.value)
    assert "odd.pth" in message and "\n" not in message
    assert "missing 1 tensor(s): model.layers.3.mlp.up_proj.weight" in message
    assert "unexpected 1 tensor(s): model.layers.0.mlp.extra.weight" in message


def test_not_a_state_dict(tmp_path):
    torch.save([torch.zeros(2)], tmp_path / "list.pth")
    with pytest.raises(CheckpointError, match="expected a state_dict"):
        load_model(tmp_path / "list.pth")


def test_tokenizer_too_big_for_the_checkpoint_stops_before_any_model_job(tmp_path, course):
    small = tmp_path / "small.pth"
    save_checkpoint(random_model(vocab_size=100), small)
    config = {**course_config(course), "pretrain": str(small)}
    result = snakemake(tmp_path, "results/topp.json", config=config, check=False)
    assert result.returncode != 0
    line = error_line(result, "do not belong together")
    assert "config key 'pretrain'" in line and "small.pth" in line and "vocab_size=100" in line
    assert model_jobs_run(tmp_path) == set()


def test_padded_model_vocabulary_is_fine(tmp_path, course):
    vocab = load_tokenizer(course["tokenizer"]).vocab_size
    padded = tmp_path / "padded.pth"
    save_checkpoint(random_model(vocab_size=-(-vocab // 128) * 128), padded)  # up to a multiple of 128
    config = {**course_config(course), "pretrain": str(padded)}
    snakemake(tmp_path, "results/topp.json", config=config)
    assert json.loads((tmp_path / "results" / "topp.json").read_text())["0.5"] >= 1


# --- validation data ---------------------------------------------------------------------------

def write_lines(path, lines, bom=False):
    path.write_text(("\ufeff" if bom else "") + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_malformed_line_names_file_and_line(tmp_path):
    path = write_lines(tmp_path / "val.jsonl", ['{"text": "하나"}', '{"text": "둘"', '{"text": "셋"}'])
    with pytest.raises(DataError, match=r"val\.jsonl:2: not a JSON object"):
        read_texts(path, 3)


def test_line_without_text(tmp_path):
    path = write_lines(tmp_path / "val.jsonl", ['{"text": "하나"}', '{"content": "둘"}'])
    with pytest.raises(DataError, match=r'val\.jsonl:2: expected an object with a string "text" field'):
        read_texts(path, 2)


def test_fewer_documents_than_n_docs(tmp_path):
    path = write_lines(tmp_path / "val.jsonl", ['{"text": "하나"}'])
    with pytest.raises(DataError, match=r"val\.jsonl: has 1 documents, the lab needs n_docs=6"):
        read_texts(path, 6)


def test_empty_file(tmp_path):
    path = tmp_path / "val.jsonl"
    path.write_text("")
    with pytest.raises(DataError, match="has 0 documents"):
        read_texts(path, 1)


def test_bom_and_blank_lines_are_accepted(tmp_path):
    path = write_lines(tmp_path / "val.jsonl", ['{"text": "하나"}', "", "   ", '{"text": "둘"}'], bom=True)
    assert read_texts(path, 2) == ["하나", "둘"]


def test_fewer_tokens_than_cut_tokens(tokenizer_dir):
    with pytest.raises(DataError, match="fewer than cut_tokens=500"):
        make_prompt(load_tokenizer(tokenizer_dir), ["짧은 글"], 500)


def test_bad_validation_data_fails_the_prompt_job(tmp_path, course):
    bad = write_lines(tmp_path / "val.jsonl", ['{"text": "하나"}', "not json"])
    config = {**course_config(course), "val_data": str(bad)}
    result = snakemake(tmp_path, "results/prompt.json", config=config, check=False)
    assert result.returncode != 0
    line = error_line(result, "kvlab error in rule prompt")
    assert f"{bad}:2" in line
    assert_no_results(tmp_path, ["prompt"])


# --- tokenizer ---------------------------------------------------------------------------------

def test_chat_template_fallback_is_reported(tmp_path, course, course_build):
    plain = tmp_path / "tok"
    shutil.copytree(course["tokenizer"], plain)
    config_path = plain / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    del config["chat_template"]
    config_path.write_text(json.dumps(config), encoding="utf-8")
    run_config = {**course_config(course), "tokenizer": str(plain)}
    snakemake(tmp_path, "results/temp.json", config=run_config)
    answers = tmp_path / "results" / "temp_answers.json"
    assert json.loads(answers.read_text(encoding="utf-8"))["chat_template"] == "ChatML fallback"
    # the report says so: rendered from this step 5 and the shared build's other steps
    from kvlab.present.report import render_report
    from test_workflow import REPORT_INPUTS

    paths = {name: course_build / "results" / f"{stem}.json" for name, stem in REPORT_INPUTS.items()}
    paths.update(temp=tmp_path / "results" / "temp.json", temp_answers=answers)
    template = ROOT / "templates" / "report" / "report.md.j2"
    assert "ChatML" in render_report(template, paths, "ko")
    assert "ChatML" not in render_report(template,
                                         {**paths, "temp_answers": course_build / "results" / "temp_answers.json"}, "ko")


# --- limits ------------------------------------------------------------------------------------

def test_generation_past_max_positions_is_refused(tmp_path, course):
    short = tmp_path / "short.pth"
    save_checkpoint(random_model(vocab_size=load_tokenizer(course["tokenizer"]).vocab_size), short)
    config = {**course_config(course, same={"new_tokens": 40}), "pretrain": str(short),
              "model_overrides": {"max_position_embeddings": 96}}
    result = snakemake(tmp_path, "results/same.json", config=config, check=False)
    assert result.returncode != 0
    line = error_line(result, "kvlab error in rule same")
    assert "max_position_embeddings (96)" in line
    assert_no_results(tmp_path, ["same", "count"])


# --- faults ------------------------------------------------------------------------------------

def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": object()})
    assert not target.exists() and list(tmp_path.iterdir()) == []
    write_json_atomic(target, {"ok": 1})
    write_json_atomic(target, {"ok": 2})
    assert json.loads(target.read_text()) == {"ok": 2} and len(list(tmp_path.iterdir())) == 1


def start_and_kill(workdir, target, config, log_name, marker):
    """Start a build of `target`, SIGKILL the whole process group once the job's log shows
    `marker`, then unlock (a SIGKILL leaves Snakemake's lock behind; the README says so)."""
    proc = subprocess.Popen(snakemake_cmd(workdir, target, config=config), cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    log = workdir / "results" / "logs" / log_name
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and marker in log.read_text(encoding="utf-8")):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert marker in log.read_text(encoding="utf-8"), "the job never got going"
    snakemake(workdir, "--unlock", config=config)


def test_run_killed_during_timing_reruns_to_completion(tmp_path, course):
    config = course_config(course, time={"new_tokens": 40, "repeats": 25})
    snakemake(tmp_path, "results/prompt.json", config=config)
    start_and_kill(tmp_path, "results/time.json", config, "timing.log", "loaded")
    assert not (tmp_path / "results" / "time.json").exists()
    rerun_config = course_config(course, time={"new_tokens": 4, "repeats": 3})
    snakemake(tmp_path, "results/time.json", config=rerun_config)
    timing = json.loads((tmp_path / "results" / "time.json").read_text())
    assert timing["speedup"] > 0
    assert json.loads((tmp_path / "results" / "time_runs.json").read_text())["new_tokens"] == 4


def test_run_killed_during_training_reruns_to_completion(tmp_path):
    config = course_config({}) | {"default_model": {
        "corpus": {"train_docs": 150, "val_docs": 10, "sft_examples": 120},
        "tokenizer": {"vocab_size": 400},
        "pretrain": {"steps": 120, "batch_size": 4, "seq_len": 64},
        "sft": {"steps": 3, "batch_size": 4, "seq_len": 64},
    }}
    start_and_kill(tmp_path, "results/default/pretrain.pth", config, "pretrain.log", "pretrain step 25/120")
    default = tmp_path / "results" / "default"
    assert not (default / "pretrain.pth").exists() and not (default / "pretrain_metrics.json").exists()
    snakemake(tmp_path, "results/default/pretrain.pth", config=config)
    metrics = json.loads((default / "pretrain_metrics.json").read_text())
    assert metrics["steps"] == 120
    assert load_model(default / "pretrain.pth").config.num_hidden_layers == 4
    assert not list(default.glob(".*.tmp"))  # no temporary file of the killed run stands beside it


# --- determinism -------------------------------------------------------------------------------

# wall-clock measurements differ run to run: these files hold times
