import json

import pytest
from hypothesis import settings

from kvlab.default_model.bpe import train_tokenizer
from kvlab.engine.checkpoint import save_checkpoint
from kvlab.engine.tokenizer import load_tokenizer

from helpers import course_config, random_model, snakemake

# No test asserts a time, and hypothesis's deadline (200 ms an example) is one that a busy machine, or the
# other pytest worker, can miss.
settings.register_profile("kvlab", deadline=None)
settings.load_profile("kvlab")

SENTENCES = [
    "민수는 아침에 가람 마을의 시장에 갔다.",
    "가람 마을의 특산물은 배입니다.",
    "지우는 여름에 바다 마을에서 친구를 만났다.",
    "user\n가람 마을의 특산물은 무엇인가요?",
    "assistant\n가람 마을의 특산물은 배입니다.",
]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A small byte-level BPE folder trained by kvlab.default_model.bpe, with a ChatML template."""
    folder = tmp_path_factory.mktemp("tok")
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": s}, ensure_ascii=False) + "\n" for s in SENTENCES * 20), encoding="utf-8")
    train_tokenizer([corpus], 400, folder)
    return folder


@pytest.fixture(scope="session")
def course(tmp_path_factory, tokenizer_dir):
    """A course folder as a user would point at: checkpoints, tokenizer, validation data."""
    folder = tmp_path_factory.mktemp("course")
    vocab = load_tokenizer(tokenizer_dir).vocab_size
    save_checkpoint(random_model(0, vocab_size=vocab), folder / "pretrain.pth")
    save_checkpoint(random_model(1, vocab_size=vocab), folder / "sft.pth")
    docs = [f"민수는 {i}일에 가람 마을의 시장에 갔다. 지우는 바다 마을에서 친구를 만났다. "
            f"가람 마을의 특산물은 배입니다. 민수는 여름에 {i}번 바다에 갔다." for i in range(8)]
    (folder / "pretrain_val.jsonl").write_text(
        "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    return {"pretrain": folder / "pretrain.pth", "sft": folder / "sft.pth", "tokenizer": tokenizer_dir,
            "val_data": folder / "pretrain_val.jsonl"}


@pytest.fixture(scope="session")
def course_build(tmp_path_factory, course):
    """The whole workflow built once on the course folder with the tests' small sizes (a working
    folder with results/). Tests read it; a test that must change it works on a copy
    (shutil.copytree keeps the files' times, so the copy is as up to date as the build)."""
    workdir = tmp_path_factory.mktemp("run")
    config = course_config(course)
    result = snakemake(workdir, config=config, check=False)
    # step 3 timed while the other worker compiles or times can come out with the cache side slower, which
    # the sheet's check fails (a tiny model: 0.1 s a generation); timed again, at most three more times
    for _ in range(3):
        if result.returncode == 0 or "check failed: cache_faster" not in result.stderr + result.stdout:
            break
        result = snakemake(workdir, "--forcerun", "timing", config=config, check=False)
    assert result.returncode == 0, f"snakemake failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return workdir


def pytest_collection_modifyitems(config, items):
    """The cluster's tests first: one pytest worker runs them in turn (most of their time waiting on
    Slurm's status checks) while the other takes the rest."""
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)
