"""minimind_src and results/fidelity.json: kvlab's engine held against a user's MiniMind file.

MiniMind's own code is not in this repository. tests/fake_minimind/model_minimind.py stands in for
it: MiniMind's interface over kvlab's engine, so unchanged it must agree everywhere, and an altered
copy (one knob changed) must be reported at the place the change shows first."""
import json
import shutil
import sys
from pathlib import Path

import pytest

from kvlab.engine.checkpoint import load_model, save_checkpoint
from kvlab.engine.tokenizer import load_tokenizer
from kvlab.measure import steps
from kvlab.measure.fidelity import LabSettings, hold_against_minimind, leaf_checks
from kvlab.measure.minimind_src import MiniMindSourceError, load_source
from kvlab.measure.prompt import make_prompt

from helpers import SMALL_LAB, course_config, random_model, snakemake

FAKE = Path(__file__).parent / "fake_minimind" / "model_minimind.py"
QUESTION = "가람 마을의 특산물은 무엇인가요?"


def altered_copy(folder: Path, *replacements) -> Path:
    """The stand-in with each (old, new) knob line replaced, written to folder/model_minimind.py."""
    text = FAKE.read_text(encoding="utf-8")
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model_minimind.py"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizer(course):
    return load_tokenizer(course["tokenizer"])


@pytest.fixture(scope="module")
def settings(course, tokenizer):
    texts = [json.loads(line)["text"] for line in course["val_data"].read_text(encoding="utf-8").splitlines()]
    prompt = make_prompt(tokenizer, texts[:3], 40)
    return LabSettings(prompt_ids=prompt["ids"], new_tokens=10, question=QUESTION, temperatures=[0.3, 1.5],
                       samples=6, max_new_tokens=5, seed=0, prefixes=["민수는", "가람 마을의 특산물은"],
                       ps=[0.5, 0.9, 0.99])


def hold(source, course, tokenizer, settings, overrides=None, checkpoints=None):
    overrides = overrides or {}
    paths = checkpoints or {"pretrain": course["pretrain"], "sft": course["sft"]}
    models = {name: (path, load_model(path, **overrides)) for name, path in paths.items()}
    return hold_against_minimind(source, models, tokenizer, settings, "cpu", overrides)


# 2 (logits, cache) + 2 greedy + one per temperature + one per prefix, for each checkpoint
CHECKS = 2 * (2 + 2 + 2 + 2)


def test_unchanged_stand_in_is_identical_everywhere(course, tokenizer, settings):
    result = hold(FAKE, course, tokenizer, settings)
    assert result["identical"] is True and result["differences"] == []
    assert result["checks"] == CHECKS
    assert result["minimind"]["layout"].startswith("minimind-3") and result["minimind"]["qk_norm"] is True
    assert result["minimind"]["generate_in_file"] is True and result["minimind"]["transformers"] is None
    for name in ("pretrain", "sft"):
        entry = result["checkpoints"][name]
        assert entry["config_differences"] == {}
        assert entry["passed_to_minimind_config"]["num_attention_heads"] == 4
        assert entry["kvlab_assumed"]["config"]["head_dim"] == 32 and entry["kvlab_assumed"]["layout"] == "minimind-3"
        assert "rms_norm_eps" not in entry["passed_to_minimind_config"]  # a layout default: the file's own
        leaves = leaf_checks(entry["checks"])
        assert len(leaves) == CHECKS // 2 and all(check["identical"] for _, check in leaves)
        checks = entry["checks"]
        assert checks["logits"]["max_abs_diff"] == 0.0 and checks["logits"]["shape"][1] == len(settings.prompt_ids)
        assert checks["kv_cache"]["k_shape"] == [1, len(settings.prompt_ids), 2, 32]
        assert checks["greedy_with_cache"]["new_tokens"] == 10
        assert checks["sampled"]["1.5"]["rows"] == 6
    # step 6's own numbers, on kvlab's side of the top-p check
    pretrain = load_model(course["pretrain"])
    lab_counts = steps.top_p_survivors(steps.next_token_logits(pretrain, tokenizer, "민수는", "cpu"), settings.ps)
    assert result["checkpoints"]["pretrain"]["checks"]["topp"]["민수는"]["kvlab"] == lab_counts


def test_a_different_rope_base_is_found_at_position_1(tmp_path, course, tokenizer, settings):
    """Position 0 has rotation angle 0 whatever the base, so the first difference is at position 1,
    and in K (V is not rotated), of the first layer, not in dimension 0 (its frequency is 1 for any base)."""
    source = altered_copy(tmp_path, ("ROPE_THETA = 1e6", "ROPE_THETA = 1e5"))
    result = hold(source, course, tokenizer, settings)
    assert result["identical"] is False
    checks = result["checkpoints"]["pretrain"]["checks"]
    logits = checks["logits"]
    assert logits["identical"] is False and logits["first_difference"]["position"] == 1
    assert logits["first_difference"]["kvlab"] != logits["first_difference"]["minimind"]
    cache = checks["kv_cache"]["first_difference"]
    assert (cache["layer"], cache["tensor"], cache["position"], cache["dim"]) == (0, "k", 1, 1)
    assert result["checkpoints"]["pretrain"]["config_differences"] == {"rope_theta": {"kvlab": 1e6, "minimind": 1e5}}
    assert result["differences"][0].startswith("pretrain logits: row=0, position=1,")


def test_a_different_top_p_rule_is_found_only_in_the_top_p_counts(tmp_path, course, tokenizer, settings):
    """Cutting the token that crosses p too keeps one token fewer (never fewer than the top one);
    nothing else uses top-p, so everything else stays identical."""
    source = altered_copy(tmp_path, ('TOP_P_RULE = "shifted"', 'TOP_P_RULE = "unshifted"'))
    result = hold(source, course, tokenizer, settings)
    for name in ("pretrain", "sft"):
        checks = result["checkpoints"][name]["checks"]
        for check_name, check in leaf_checks(checks):
            assert check["identical"] is not check_name.startswith("topp "), check_name
        for prefix, check in checks["topp"].items():
            assert check["minimind"] == {p: max(n - 1, 1) for p, n in check["kvlab"].items()}
            first_p = next(p for p, n in check["kvlab"].items() if n > 1)
            assert check["first_difference"] == {"p": first_p, "kvlab": check["kvlab"][first_p],
                                                 "minimind": check["kvlab"][first_p] - 1}
    assert all(" topp " in line for line in result["differences"])
    assert len(result["differences"]) == 4  # two prefixes, two checkpoints


def test_minimind2_layout_with_model_overrides(tmp_path, tokenizer, settings, course):
    """A MiniMind2-era file (no q/k norms) on MiniMind2-layout checkpoints, whose head count comes
    from model_overrides as the README says."""
    paths = {}
    for seed, name in enumerate(("pretrain", "sft")):
        paths[name] = tmp_path / f"{name}.pth"
        save_checkpoint(random_model(seed, vocab_size=tokenizer.vocab_size, qk_norm=False), paths[name])
    overrides = {"num_attention_heads": 4}
    assumed_eps = load_model(paths["pretrain"], **overrides).config.rms_norm_eps  # whatever kvlab assumes
    source = altered_copy(tmp_path / "mm2", ("QK_NORM = True", "QK_NORM = False"),
                          ("RMS_NORM_EPS = 1e-6", f"RMS_NORM_EPS = {assumed_eps!r}"))
    result = hold(source, course, tokenizer, settings, overrides=overrides, checkpoints=paths)
    assert result["identical"] is True, result["differences"]
    assert result["minimind"]["layout"].startswith("MiniMind2") and result["minimind"]["qk_norm"] is False
    assert result["model_overrides"] == overrides
    entry = result["checkpoints"]["pretrain"]
    assert entry["kvlab_assumed"]["layout"] == "MiniMind2" and entry["kvlab_assumed"]["sources"]["num_attention_heads"] == "user"
    assert entry["kvlab_assumed"]["config"]["num_attention_heads"] == 4
    assert entry["checks"]["kv_cache"]["k_shape"][2:] == [2, 32]


# --- bad input: one line naming the file and what is wrong ---------------------------------------


def one_line_error(source, match, *args):
    with pytest.raises(MiniMindSourceError) as caught:
        if args:
            hold(source, *args)
        else:
            load_source(source)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(source)), message
    assert match in message, message
    return message


def test_not_a_python_file(tmp_path):
    notes = tmp_path / "model_minimind.txt"
    notes.write_text("class MiniMindForCausalLM: pass\n")
    one_line_error(notes, "not a Python file")
    one_line_error(tmp_path, "not a file")
    one_line_error(tmp_path / "gone.py", "file not found")


def test_a_file_without_the_model_class(tmp_path):
    source = tmp_path / "model_minimind.py"
    source.write_text("class MiniMindConfig:\n    pass\n")
    one_line_error(source, "defines no class MiniMindForCausalLM")
    source.write_text("class MiniMindConfig:\n    pass\n\nclass MiniMindForCausalLM:\n    pass\n")
    one_line_error(source, "MiniMindForCausalLM has no generate")


@pytest.mark.parametrize("code, match", [
    ("raise RuntimeError('checkpoint folder not mounted')\n",
     "raised RuntimeError on import: checkpoint folder not mounted"),
    ("def broken(:\n", "raised SyntaxError on import"),
    ("import sys\nsys.exit(3)\n", "raised SystemExit on import"),
    ("import kvlab_no_such_module\n", "needs the module 'kvlab_no_such_module', which is not installed"),
])
def test_a_file_that_raises_on_import(tmp_path, code, match):
    source = tmp_path / "model_minimind.py"
    source.write_text(code)
    one_line_error(source, match)
    assert "kvlab_minimind_src" not in sys.modules


def test_transformers_missing_names_the_extra(tmp_path, monkeypatch):
    source = tmp_path / "model_minimind.py"
    source.write_text("from transformers import PreTrainedModel, GenerationMixin, PretrainedConfig\n")
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    one_line_error(source, 'needs the transformers package, which is not installed: pip install -e ".[minimind]"')


def test_a_config_that_cannot_hold_the_checkpoint(tmp_path, course, tokenizer, settings):
    """A MiniMind2-era file has no q/k norms: a minimind-3 checkpoint has tensors it cannot hold."""
    source = altered_copy(tmp_path, ("QK_NORM = True", "QK_NORM = False"))
    message = one_line_error(source, "cannot hold the checkpoint", course, tokenizer, settings)
    assert str(course["pretrain"]) in message
    assert "unexpected 8 tensor(s): model.layers.0.self_attn.q_norm.weight" in message


# --- the workflow ----------------------------------------------------------------------------------


def fidelity_config(course, source, **changes):
    return course_config(course, **changes) | {"minimind_src": str(source)}


@pytest.fixture(scope="module")
def built(tmp_path_factory, course, course_build):
    """The shared build (tests/conftest.py), copied with its times, then built again with minimind_src
    set: the fidelity job and what reads it run, the lab's steps are already there."""
    workdir = tmp_path_factory.mktemp("fidelity") / "run"
    shutil.copytree(course_build, workdir, symlinks=True)
    snakemake(workdir, config=fidelity_config(course, FAKE))
    return workdir


def test_workflow_writes_fidelity_json_and_the_report_line(built, course):
    result = json.loads((built / "results" / "fidelity.json").read_text(encoding="utf-8"))
    assert result["identical"] is True and result["checks"] == CHECKS
    assert result["settings"]["prompt_len"] == SMALL_LAB["prompt"]["cut_tokens"] + 1
    assert result["settings"]["temperatures"] == SMALL_LAB["temp"]["temperatures"]
    assert result["settings"]["new_tokens"] == SMALL_LAB["same"]["new_tokens"]
    report = (built / "results" / "report.md").read_text(encoding="utf-8")
    assert f"`{FAKE}`" in report and f"검사 {CHECKS}개가 모두 비트 단위로 같습니다" in report


def test_fidelity_is_scheduled_only_with_minimind_src(tmp_path, course):
    without = snakemake(tmp_path, "-n", config=course_config(course))
    assert "rule fidelity:" not in without.stdout + without.stderr and "rule report:" in without.stdout
    with_source = snakemake(tmp_path, "-n", config=fidelity_config(course, FAKE))
    assert "rule fidelity:" in with_source.stdout + with_source.stderr


def test_workflow_reports_an_altered_copy(built, course, tmp_path):
    """Pointing minimind_src at another file reruns the check and the report, nothing else."""
    source = altered_copy(tmp_path / "altered", ("ROPE_THETA = 1e6", "ROPE_THETA = 1e5"))
    config = fidelity_config(course, source)
    dry = snakemake(built, "-n", "results/report.md", config=config)
    jobs = [line.split()[1].rstrip(":") for line in dry.stdout.splitlines() if line.startswith("rule ")]
    assert sorted(jobs) == ["fidelity", "report"], jobs
    snakemake(built, "results/report.md", config=config)
    result = json.loads((built / "results" / "fidelity.json").read_text(encoding="utf-8"))
    assert result["identical"] is False
    assert result["differences"][0].startswith("pretrain logits: row=0, position=1,")
    report = (built / "results" / "report.md").read_text(encoding="utf-8")
    assert f"검사 {CHECKS}개 가운데 {len(result['differences'])}개가 다릅니다" in report
    # the same line in English (the figures are redrawn in English too, so this comes last)
    snakemake(built, "results/report.md", config=config | {"report": {"language": "en"}})
    report = (built / "results" / "report.md").read_text(encoding="utf-8")
    assert f"{len(result['differences'])} of {CHECKS} checks differ (`results/fidelity.json`)" in report
    snakemake(built, "results/report.md", config=fidelity_config(course, FAKE) | {"report": {"language": "en"}})
    report = (built / "results" / "report.md").read_text(encoding="utf-8")
    assert f"all {CHECKS} checks bit-identical" in report


def test_workflow_bad_source_is_one_line(tmp_path, course):
    notes = tmp_path / "model_minimind.md"
    notes.write_text("notes")
    result = snakemake(tmp_path, "-n", config=fidelity_config(course, notes), check=False)
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "config key 'minimind_src'" in line]
    assert lines and "not a Python file" in lines[0] and str(notes) in lines[0]
    assert not (tmp_path / "results").exists()

    raising = tmp_path / "model_minimind.py"
    raising.write_text("raise ImportError('flash_attn is not built')\n")
    result = snakemake(tmp_path, "results/fidelity.json", config=fidelity_config(course, raising), check=False)
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "kvlab error in rule fidelity" in line]
    assert lines and f"{raising}: raised ImportError on import: flash_attn is not built" in lines[0]
    assert not (tmp_path / "results" / "fidelity.json").exists()
