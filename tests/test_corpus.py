"""The generated Korean world: particles, determinism, held-out validation, one specialty per village."""
import json
import re

import pytest
import yaml

from kvlab.default_model.corpus import (
    LAB_QUESTION,
    PEOPLE,
    VILLAGE_BY_NAME,
    VILLAGES,
    make_corpus,
    particle,
    write_corpus,
)

from helpers import ROOT


@pytest.mark.parametrize(
    "word, kind, expected",
    [
        ("사과", "을/를", "사과를"),  # vowel
        ("인삼", "을/를", "인삼을"),  # consonant
        ("인삼", "를", "인삼을"),  # either spelling names the particle
        ("사과", "을", "사과를"),
        ("사과", "를/을", "사과를"),
        ("민수", "은/는", "민수는"),
        ("지영", "은", "지영은"),
        ("오후", "이/가", "오후가"),
        ("가을", "이", "가을이"),
        ("친구", "과/와", "친구와"),
        ("동생", "와", "동생과"),
        ("바다", "으로/로", "바다로"),  # vowel: 로
        ("집", "으로", "집으로"),  # consonant: 으로
        ("마을", "으로", "마을로"),  # ㄹ final: 로, not 으로
        ("서울", "로", "서울로"),
        ("복숭아", "이다", "복숭아다"),
        ("인삼", "이다", "인삼이다"),
        ("지영", "아/야", "지영아"),
        ("민수", "아", "민수야"),
        ("3", "을", "3을"),  # 삼: consonant
        ("2", "을", "2를"),  # 이: vowel
        ("7", "으로", "7로"),  # 칠: ㄹ final
    ],
)
def test_particle(word, kind, expected):
    assert particle(word, kind) == expected


def test_particle_refuses_what_it_cannot_decide():
    with pytest.raises(ValueError, match="unknown particle"):
        particle("사과", "의")
    with pytest.raises(ValueError, match="not Hangul"):
        particle("apple", "을")


def test_world_is_fixed_and_each_village_has_one_specialty():
    assert len(VILLAGES) >= 20
    names = [v.name for v in VILLAGES]
    specialties = [v.specialty for v in VILLAGES]
    assert len(set(names)) == len(names)
    assert len(set(specialties)) == len(specialties)
    # an answer naming one specialty never contains another by accident
    for a in specialties:
        for b in specialties:
            assert a == b or a not in b
    assert VILLAGE_BY_NAME["가람"].specialty == "복숭아"
    assert "민수" in {person.name for person in PEOPLE}
    assert all(p.home in VILLAGE_BY_NAME for p in PEOPLE)


def test_corpus_is_deterministic_and_seeded():
    a = make_corpus(0, 60, 10, 80)
    b = make_corpus(0, 60, 10, 80)
    c = make_corpus(1, 60, 10, 80)
    assert a == b
    assert a["train"] != c["train"] and a["val"] != c["val"] and a["sft"] != c["sft"]
    assert (len(a["train"]), len(a["val"]), len(a["sft"])) == (60, 10, 80)


def test_files_are_byte_identical_across_runs(tmp_path):
    digests = []
    for run in ("one", "two"):
        out = {k: tmp_path / run / f"{k}.jsonl" for k in ("pretrain_train", "pretrain_val", "sft")}
        write_corpus(out, seed=3, train_docs=40, val_docs=8, sft_examples=30)
        digests.append([p.read_bytes() for p in out.values()])
    assert digests[0] == digests[1]


def test_validation_is_held_out_and_not_a_prefix_of_train():
    corpus = make_corpus(0, 2000, 200, 10)
    train = set(corpus["train"])
    assert not train & set(corpus["val"])
    assert len(set(corpus["val"])) == len(corpus["val"])
    # validation documents come from their own stream: the training size leaves them unchanged
    assert make_corpus(0, 100, 20, 10)["val"] == make_corpus(0, 50, 20, 10)["val"]
    assert corpus["val"][:5] != corpus["train"][:5]


def test_every_statement_of_a_specialty_is_the_villages_one():
    corpus = make_corpus(0, 800, 50, 800)
    texts = corpus["train"] + corpus["val"] + [m["content"] for conv in corpus["sft"] for m in conv]
    pattern = re.compile(r"(\S+) 마을의 특산물은 (\S+?)(?:이다|다|입니다)\.")
    seen = {}
    for text in texts:
        for village, specialty in pattern.findall(text):
            seen.setdefault(village, set()).add(specialty)
    assert set(seen) == set(VILLAGE_BY_NAME)  # every village is stated, with exactly one specialty
    for village, specialties in seen.items():
        assert specialties == {VILLAGE_BY_NAME[village].specialty}, village
    reverse = re.compile(r"(\S+?)[은는] (\S+) 마을의 특산물(?:이다|입니다)")
    for text in texts:
        for specialty, village in reverse.findall(text):
            assert VILLAGE_BY_NAME[village].specialty == specialty


def test_particles_in_the_generated_text_follow_the_final_consonant():
    corpus = make_corpus(0, 500, 20, 500)
    text = " ".join(corpus["train"] + [m["content"] for conv in corpus["sft"] for m in conv])
    words = [v.specialty for v in VILLAGES] + [p.name for p in PEOPLE] + ["마을"]
    checked = 0
    for word in words:
        for pair in (("은", "는"), ("이", "가"), ("을", "를"), ("과", "와"), ("으로", "로")):
            right = particle(word, pair[0])[len(word):]
            wrong = pair[1] if right == pair[0] else pair[0]
            follows = rf"(?<!\S){re.escape(word)}(%s)[\s.,?!\"]"
            assert not re.search(follows % re.escape(wrong), text), word + wrong
            checked += bool(re.search(follows % re.escape(right), text))
    assert checked > 100  # the right forms do occur, for most words and particles
    assert "마을으로" not in text and "마을로" in text


def test_documents_are_varied_after_a_name_and_fixed_after_a_village():
    corpus = make_corpus(0, 3000, 10, 10)
    after_minsu, after_garam = set(), set()
    for text in corpus["train"]:
        after_minsu.update(re.findall(r"(?:^| )민수는 (\S+)", text))
        after_garam.update(re.findall(r"(?:^| )가람 마을의 특산물은 (\S+)", text))
    assert len(after_minsu) > 30
    assert after_garam == {"복숭아다."}


def test_jsonl_formats(tmp_path):
    out = {k: tmp_path / f"{k}.jsonl" for k in ("pretrain_train", "pretrain_val", "sft")}
    write_corpus(out, seed=0, train_docs=30, val_docs=6, sft_examples=300)
    for key in ("pretrain_train", "pretrain_val"):
        raw = out[key].read_text(encoding="utf-8")
        assert "마을" in raw  # ensure_ascii=False: Korean written as is
        records = [json.loads(line) for line in raw.splitlines()]
        assert all(list(r) == ["text"] and r["text"] for r in records)
    chats = [json.loads(line)["conversations"] for line in out["sft"].read_text(encoding="utf-8").splitlines()]
    assert len(chats) == 300
    assert all([m["role"] for m in c] == ["user", "assistant"] for c in chats)
    lab = [c for c in chats if c[0]["content"] == LAB_QUESTION]
    assert lab, "the lab's question is among the chat examples"
    assert all(c[1]["content"].startswith("가람 마을의 특산물은 복숭아입니다.") for c in lab)
    phrasings = {c[0]["content"] for c in chats if c[0]["content"].startswith("가람 마을")}
    assert len(phrasings) >= 3


def test_lab_question_is_present_even_in_a_tiny_chat_set():
    sft = make_corpus(5, 1, 1, 1)["sft"]
    assert sft[0][0]["content"] == LAB_QUESTION


def test_the_lab_question_is_the_configs():
    """The default world guarantees an answer to the lab's question: the one config.yaml asks (lab.temp)."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text(encoding="utf-8"))
    assert config["lab"]["temp"]["question"] == LAB_QUESTION
