"""kvlab.default_model.bpe: MiniMind's special ids, a ChatML folder, lossless Korean, byte-identical retraining."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvlab.default_model.bpe import CHAT_TEMPLATE, train_tokenizer
from kvlab.default_model.corpus import write_corpus
from kvlab.engine.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bpe_corpus")
    out = {k: folder / f"{k}.jsonl" for k in ("pretrain_train", "pretrain_val", "sft")}
    write_corpus(out, seed=0, train_docs=300, val_docs=10, sft_examples=300)
    return out


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bpe_tok")
    summary = train_tokenizer([corpus["pretrain_train"], corpus["sft"]], 1024, folder)
    return folder, summary


def test_special_token_ids_are_minimind_s(trained):
    folder, summary = trained
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    added = {t["content"]: t["id"] for t in data["added_tokens"]}
    assert added == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    assert all(t["special"] for t in data["added_tokens"])
    tok = load_tokenizer(folder)
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert tok.vocab_size == summary["vocab_size"] <= 1024
    assert tok.encode("<|endoftext|><|im_start|><|im_end|>") == [0, 1, 2]
    assert data["pre_tokenizer"]["type"] == "ByteLevel" and data["pre_tokenizer"]["add_prefix_space"] is False
    assert data["decoder"]["type"] == "ByteLevel"


def test_tokenizer_config_is_minimind_s(trained):
    folder, _ = trained
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["bos_token"] == "<|im_start|>"
    assert config["eos_token"] == "<|im_end|>"
    assert config["pad_token"] == config["unk_token"] == "<|endoftext|>"
    assert config["add_bos_token"] is False
    assert config["chat_template"] == (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
        "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ) == CHAT_TEMPLATE
    tok = load_tokenizer(folder)
    messages = [{"role": "user", "content": "가람 마을의 특산물은 무엇인가요?"}]
    assert tok.chat_text(messages) == "<|im_start|>user\n가람 마을의 특산물은 무엇인가요?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.chat_text(messages, add_generation_prompt=False).endswith("<|im_end|>\n")


@pytest.mark.parametrize("text", [
    "가람 마을의 특산물은 복숭아입니다.",
    "민수는 아침에 시장에서 책을 읽었다. 지영은 \"좋다\"고 말했다!",
    "처음 보는 낱말: 뷁, 똠방각하, 😀 and ASCII 123\n줄바꿈",
])
def test_encode_decode_round_trip(trained, text):
    tok = load_tokenizer(trained[0])
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size for i in ids)


def test_common_words_are_single_tokens(trained):
    tok = load_tokenizer(trained[0])
    assert len(tok.encode(" 마을의")) == 1
    assert len(tok.encode("가람 마을의 특산물은")) <= 4


def test_two_trainings_are_byte_identical(corpus, trained, tmp_path):
    """Retrained in a fresh process (its own hash seeds and thread pool): the same bytes."""
    first, _ = trained
    code = (
        "import sys; from kvlab.default_model.bpe import train_tokenizer; "
        "train_tokenizer(sys.argv[1:3], 1024, sys.argv[3])"
    )
    subprocess.run([sys.executable, "-c", code, str(corpus["pretrain_train"]), str(corpus["sft"]), str(tmp_path)],
                   check=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                                               "PYTHONHASHSEED": "random"})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (first / name).read_bytes(), name


def test_default_corpus_gives_the_lab_its_prompt(tmp_path):
    """With config.yaml's corpus and tokenizer settings, the first n_docs validation documents,
    joined by spaces, give at least cut_tokens tokens (the lab cuts its prompt from them)."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text(encoding="utf-8"))
    dm, lab = config["default_model"], config["lab"]["prompt"]
    out = {k: tmp_path / f"{k}.jsonl" for k in ("pretrain_train", "pretrain_val", "sft")}
    write_corpus(out, dm["seed"], **dm["corpus"])
    train_tokenizer([out["pretrain_train"], out["sft"]], dm["tokenizer"]["vocab_size"], tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    with open(out["pretrain_val"], encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f][: lab["n_docs"]]
    assert len(tok.encode(" ".join(docs))) >= lab["cut_tokens"]
