"""`kvlab export`: a checkpoint as a transformers folder and a GGUF file, each checked where it lands
against kvlab's `generate` (kvlab.export). Round trips for the lab's shape, MiniMind's released shape
(random weights), an untied head and MiniMind2's layers (no q/k norms: Llama in transformers, refused as
GGUF); refusals in one line with nothing written. The GGUF is run by llama.cpp (llama-cpp-python), where
it is installed."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from kvlab.engine.checkpoint import save_checkpoint
from kvlab.engine.tokenizer import load_tokenizer
from kvlab.export.run import ExportError, export

from helpers import random_model

pytest.importorskip("transformers", reason="transformers is not installed (pip install 'kvlab[export]')")
NO_LLAMA = importlib.util.find_spec("llama_cpp") is None
LLAMA_SKIP = ("llama-cpp-python is not installed (it builds llama.cpp from source, several minutes: "
              "CMAKE_ARGS='-DGGML_NATIVE=ON' pip install llama-cpp-python); the GGUF is not run in llama.cpp here")
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


def test_minimind2s_layers_go_to_transformers_as_llama_and_are_refused_as_gguf(tmp_path, tokenizer_dir, tokenizer):
    checkpoint = checkpoint_of(tmp_path, tokenizer, qk_norm=False)
    heads = {"num_attention_heads": 4}  # what a MiniMind2 file does not reveal (the workflow's model_overrides)
    record = export(checkpoint, tokenizer_dir, "hf", tmp_path / "hf", prompt_of(tokenizer), TEXTS, new_tokens=16,
                    overrides=heads)
    assert record["loaded_as"] == "LlamaForCausalLM" and record["same_tokens"]
    with pytest.raises(ExportError, match="qk_norm is off"):
        export(checkpoint, tokenizer_dir, "gguf", tmp_path / "m.gguf", prompt_of(tokenizer), TEXTS, overrides=heads)
    assert not (tmp_path / "m.gguf").exists() and not (tmp_path / "m.json").exists()


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
