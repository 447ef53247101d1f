"""`kvlab export`: a checkpoint as a transformers folder and a GGUF file, each checked where it lands
against kvlab's `generate` (kvlab.export). Round trips for the lab's shape, MiniMind's released shape
(random weights), an untied head and MiniMind2's layers (no q/k norms: Llama in transformers, refused as
GGUF); refusals in one line with nothing written. The GGUF is run by llama.cpp (llama-cpp-python), where
it is installed."""
from __future__ import annotations

import importlib.util
import html
import json
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest

from kvlab.engine.checkpoint import save_checkpoint
from kvlab.engine.tokenizer import load_tokenizer
from kvlab.export.run import ExportError, export

from helpers import ROOT, SMALL_EXTRAS, course_config, random_model, snakemake

pytest.importorskip("transformers", reason="transformers is not installed (pip install 'kvlab[export]')")
NO_LLAMA = importlib.util.find_spec("llama_cpp") is None
LLAMA_SKIP = ("llama-cpp-python is not installed (it builds llama.cpp from source, several minutes: "
              "CMAKE_ARGS='-DGGML_NATIVE=ON' pip install -e '.[llama]'); the GGUF is not run in llama.cpp here")
TEXTS = ["민수는 가람 마을에 산다.", "The cache is exact; its precision is a choice.", "가람 마을의 특산물은 복숭아입니다!"]
SHAPES = {
    "lab": {},
    # MiniMind's released size: hidden 768, 8 layers, 8 heads of 96, 4 KV heads (weights random)
    "minimind": dict(hidden_size=768, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=96),
    "untied": dict(tie_word_embeddings=False),
}


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def checkpoint_of(folder, tokenizer, seed=0, **arch):
    path = folder / "model.pth"
    save_checkpoint(random_model(seed, vocab_size=tokenizer.vocab_size, **arch), path)
    return path


def prompt_of(tokenizer):
    return [tokenizer.bos_id] + tokenizer.encode("민수는 가람 마을의 특산물을 묻습니다")


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_folder_gives_kvlabs_logits_and_greedy_tokens_in_transformers(tmp_path, tokenizer_dir, tokenizer, shape):
    checkpoint = checkpoint_of(tmp_path, tokenizer, **SHAPES[shape])
    record = export(checkpoint, tokenizer_dir, "hf", tmp_path / "hf", prompt_of(tokenizer), TEXTS, new_tokens=24)
    assert record["loaded_as"] == "Qwen3ForCausalLM"
    assert record["same_tokens"] and record["first_difference"] is None, record
    assert record["max_logit_difference"] <= 1e-4, record["max_logit_difference"]
    assert record["tokenizer_differs"] == 0 and record["tokenizer_texts"] == len(TEXTS)
    assert json.loads((tmp_path / "hf" / "kvlab_export.json").read_text()) == json.loads(json.dumps(record))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["tie_word_embeddings"] == (shape != "untied") and config["architectures"] == ["Qwen3ForCausalLM"]
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.skipif(NO_LLAMA, reason=LLAMA_SKIP)
@pytest.mark.parametrize("shape, file_type", [("lab", "f32"), ("untied", "f32"), ("lab", "f16")])
def test_the_gguf_gives_kvlabs_greedy_tokens_in_llama_cpp(tmp_path, tokenizer_dir, tokenizer, shape, file_type):
    checkpoint = checkpoint_of(tmp_path, tokenizer, **SHAPES[shape])
    out = tmp_path / "model.gguf"
    record = export(checkpoint, tokenizer_dir, "gguf", out, prompt_of(tokenizer), TEXTS, file_type, new_tokens=24)
    assert record["same_tokens"], record["first_difference"]
    assert record["tokenizer_differs"] == 0
    assert out.is_file() and json.loads(out.with_suffix(".json").read_text())["file_type"] == file_type


def test_minimind2s_layers_go_to_transformers_as_llama(tmp_path, tokenizer_dir, tokenizer):
    checkpoint = checkpoint_of(tmp_path, tokenizer, qk_norm=False)
    heads = {"num_attention_heads": 4}  # what a MiniMind2 file does not reveal (the workflow's model_overrides)
    record = export(checkpoint, tokenizer_dir, "hf", tmp_path / "hf", prompt_of(tokenizer), TEXTS, new_tokens=16,
                    overrides=heads)
    assert record["loaded_as"] == "LlamaForCausalLM" and record["same_tokens"]


@pytest.mark.skipif(NO_LLAMA, reason=LLAMA_SKIP)
@pytest.mark.parametrize("arch", [dict(qk_norm=False), dict(qk_norm=False, hidden_size=768, num_hidden_layers=2,
                                                            num_attention_heads=8, num_key_value_heads=2)])
def test_minimind2s_layers_go_to_llama_cpp_as_llama_with_q_and_k_reordered(tmp_path, tokenizer_dir, tokenizer, arch,
                                                                           monkeypatch):
    """Without q/k norms the GGUF is llama.cpp's llama, whose rotation turns adjacent pairs: q_proj's and
    k_proj's rows reordered per head give kvlab's greedy tokens (unreordered, they would not)."""
    from kvlab.export import gguf_file

    checkpoint = checkpoint_of(tmp_path, tokenizer, **arch)
    overrides = {"num_attention_heads": arch.get("num_attention_heads", 8)}
    out = tmp_path / "m.gguf"
    record = export(checkpoint, tokenizer_dir, "gguf", out, prompt_of(tokenizer), TEXTS, new_tokens=24,
                    overrides=overrides)
    assert record["same_tokens"], record["first_difference"]
    import gguf

    assert gguf.GGUFReader(str(out)).fields["general.architecture"].contents() == "llama"
    weight = np.arange(2 * 8 * 3, dtype=np.float32).reshape(16, 3)  # 2 heads of 8 rows
    reordered = gguf_file.rotated_pairs_adjacent(weight, heads=2)
    assert [int(row[0]) // 3 for row in reordered] == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]
    monkeypatch.setattr(gguf_file, "rotated_pairs_adjacent", lambda weight, heads: weight)
    unordered = export(checkpoint, tokenizer_dir, "gguf", tmp_path / "u.gguf", prompt_of(tokenizer), TEXTS,
                       new_tokens=24, overrides=overrides)
    assert not unordered["same_tokens"]


@pytest.mark.parametrize("case, match", [("exists", "already there"), ("suffix", "ends in .gguf"),
                                         ("vocabulary", "does not belong to the checkpoint")])
def test_what_cannot_be_exported_fails_in_one_line_with_nothing_written(tmp_path, tokenizer_dir, tokenizer, case,
                                                                         match):
    vocab = {"vocabulary": tokenizer.vocab_size + 1000}.get(case, tokenizer.vocab_size)
    path = tmp_path / "model.pth"
    save_checkpoint(random_model(0, vocab_size=vocab), path)
    out = {"exists": tmp_path / "taken", "suffix": tmp_path / "model.bin"}.get(case, tmp_path / "hf")
    if case == "exists":
        out.mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ExportError, match=match) as raised:
        export(path, tokenizer_dir, "gguf" if case == "suffix" else "hf", out, prompt_of(tokenizer), TEXTS)
    assert "\n" not in str(raised.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_the_command_says_what_it_checked_and_refuses_in_one_line(tmp_path, tokenizer_dir, tokenizer):
    checkpoint = checkpoint_of(tmp_path, tokenizer)
    (tmp_path / "prompt.json").write_text(json.dumps({"ids": prompt_of(tokenizer)}))
    (tmp_path / "val.jsonl").write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in TEXTS))
    command = [sys.executable, "-m", "kvlab.server", "export", str(checkpoint), "--tokenizer", str(tokenizer_dir),
               "--prompt-json", str(tmp_path / "prompt.json"), "--val-data", str(tmp_path / "val.jsonl"),
               "--new-tokens", "8", "--to", "hf", str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "transformers gives the same 8 greedy tokens as kvlab's generate" in done.stdout
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 2 and again.stderr.strip().count("\n") == 0
    assert again.stderr.startswith("kvlab export: ") and "already there" in again.stderr


def checks_record(tokens_at=None, tokenizer_differs=0, logit=0.0) -> dict:
    """A checks.json as rule export_model writes it (kvlab.export.run.agreement), with llama.cpp's tokens
    first differing at `tokens_at` (a position from 0) and transformers' tokenizer on that many texts."""
    records = {
        "hf": {"checkpoint": "m.pth", "new_tokens": 64, "tokenizer_texts": 64, "same_tokens": True,
               "first_difference": None, "tokenizer_differs": tokenizer_differs, "max_logit_difference": logit,
               "file_type": "f32", "versions": {}},
        "gguf": {"checkpoint": "m.pth", "new_tokens": 64, "tokenizer_texts": 64, "same_tokens": tokens_at is None,
                 "first_difference": None if tokens_at is None else {"position": tokens_at, "got": 5, "expected": 6},
                 "tokenizer_differs": 0, "file_type": "f16", "versions": {}},
    }
    from kvlab.export.run import agreement

    return agreement(records)


@pytest.mark.parametrize("tokens_at, tokenizer_differs, logit, said", [
    (None, 0, 0.0, ("same 64 greedy tokens", "on all 64 validation texts", "bit for bit")),
    (16, 0, 0.0, ("do not all give kvlab's 64 greedy tokens", "sft in llama.cpp first differs at new token 17.",
                  "pretrain in")),
    (None, 3, 2.5e-7, ("same 64 greedy tokens", "sft's tokenizer in transformers differs from kvlab's on 3 of 64",
                       "by at most 2.5e-07")),
])
def test_beyonds_line_says_whether_the_three_systems_agree_and_where_not(course_build, tmp_path, tokens_at,
                                                                         tokenizer_differs, logit, said):
    """The line is chosen from the records: the same tokens everywhere, or the model, the system and the new
    token where they first differ; the tokenizers' differing texts; transformers' logits bit for bit or not.
    Without the records (extras.export.in_build off) the section is left out."""
    from kvlab.facts.results import OPTIONAL, report_inputs
    from kvlab.present.report import render_report

    paths = {name: course_build / path for name, path in report_inputs(OPTIONAL).items()
             if (course_build / path).exists()}
    for model, record in (("pretrain", checks_record()), ("sft", checks_record(tokens_at, tokenizer_differs, logit))):
        paths[f"export_{model}"] = tmp_path / f"{model}.json"
        paths[f"export_{model}"].write_text(json.dumps(record))
    template = ROOT / "templates" / "report" / "beyond.md.j2"
    text = render_report(template, paths, "en")
    line = next(line for line in text.splitlines() if line.startswith("Exported by `kvlab export`"))
    for words in said:
        assert (words in line) != (words == "pretrain in"), (words, line)
    korean = render_report(template, paths, "ko")
    assert "다른 도구에서 쓰는 내 모델" in korean and ("17번째에서 처음 달라집니다" in korean) == (tokens_at is not None)
    without = {name: path for name, path in paths.items() if not name.startswith("export_")}
    assert "in other tools" not in render_report(template, without, "en")


@pytest.mark.skipif(NO_LLAMA, reason=LLAMA_SKIP)
def test_the_build_exports_its_models_when_asked_and_beyond_says_so(course_build, course, tmp_path):
    """extras.export.in_build: `rule all` exports both models (checked in transformers and llama.cpp), and
    only the exports, beyond.md and what reads it run again; beyond.md's line reads their records."""
    workdir = tmp_path  # as deep as the build's: the templates' relative paths, in its records, stay the same
    shutil.copytree(course_build, workdir, symlinks=True, dirs_exist_ok=True)
    config = course_config(course) | {"extras": {**SMALL_EXTRAS, "export": {"in_build": True, "new_tokens": 12}}}
    dry = snakemake(workdir, "-n", config=config)
    jobs = sorted(line.split()[1].rstrip(":") for line in dry.stdout.splitlines() if line.startswith("rule "))
    assert jobs == ["all", "beyond", "export_model", "export_model", "lab_report"], jobs
    snakemake(workdir, config=config)
    for model in ("pretrain", "sft"):
        checks = json.loads((workdir / "results" / "export" / model / "checks.json").read_text())
        assert set(checks["systems"]) == {"transformers", "llama.cpp"} and checks["new_tokens"] == 12
        assert checks["agree"], checks
    beyond = (workdir / "results" / "beyond.md").read_text(encoding="utf-8")
    assert "kvlab, transformers, llama.cpp(GGUF F32) 모두 같은 greedy 토큰 12개" in beyond
    # the lab's page's two commands run the exports as printed, from the workflow's folder
    page = (workdir / "results" / "explore.html").read_text(encoding="utf-8")
    commands = [html.unescape(code) for code in re.findall(r"<pre><code>(.*?)</code></pre>", page, re.S)]
    assert len(commands) == 2 and "results/export/sft/hf" in commands[0] and "sft.gguf" in commands[1]
    for command in commands:
        done = subprocess.run(shlex.split(command), capture_output=True, text=True, cwd=workdir)
        assert done.returncode == 0 and done.stdout.strip(), (command, done.stderr[-2000:])
