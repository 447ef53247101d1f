"""kvlab.default_model.train: seeded init, packing, the assistant-only SFT mask, and losses that go down."""
import io
import re

import pytest
import torch

from kvlab.default_model.bpe import train_tokenizer
from kvlab.default_model.corpus import make_corpus, write_corpus
from kvlab.engine.tokenizer import load_tokenizer
from kvlab.default_model.train import (
    IGNORE,
    assistant_labels,
    build_model,
    encode_conversations,
    evaluate,
    lm_loss,
    lr_at,
    pack_documents,
    pretrain,
    sft,
)

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            max_position_embeddings=256)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models train fastest on one thread, and two threads crawl when the CPU is shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train_world")
    out = {k: folder / f"{k}.jsonl" for k in ("pretrain_train", "pretrain_val", "sft")}
    write_corpus(out, seed=0, train_docs=200, val_docs=20, sft_examples=200)
    train_tokenizer([out["pretrain_train"], out["sft"]], 800, folder / "tok")
    corpus = make_corpus(0, 200, 20, 200)
    return load_tokenizer(folder / "tok"), corpus


def test_build_model_is_seeded_and_uses_the_lab_architecture():
    a, b, c = build_model(500, 0), build_model(500, 0), build_model(500, 1)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    cfg = a.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) \
        == (128, 4, 4, 2, 32)
    assert a.model.embed_tokens.weight is a.lm_head.weight
    assert abs(float(a.lm_head.weight.detach().std()) - 0.02) < 0.002


def test_pack_documents(world):
    tok, corpus = world
    windows = pack_documents(tok, corpus["train"][:30], 16)
    assert windows.shape[1] == 17
    assert windows[0, 0].item() == tok.bos_id
    # consecutive windows share one token: every stream position is predicted exactly once
    assert torch.equal(windows[:-1, -1], windows[1:, 0])
    stream = [t for text in corpus["train"][:30] for t in [tok.bos_id, *tok.encode(text), tok.eos_id]]
    assert windows[:, :-1].reshape(-1).tolist() == stream[: windows.shape[0] * 16]


def test_assistant_labels_mask_exactly_the_assistant_turns():
    marker, eos = [1, 10, 11], 2  # <|im_start|> assistant \n
    ids = [1, 20, 11, 5, 6, 2, 11,  # user turn
           1, 10, 11, 7, 8, 2, 11,  # assistant turn: 7 8 <|im_end|> are targets, the "\n" after is not
           1, 20, 11, 9, 2, 11,  # user turn
           1, 10, 11, 4, 3]  # assistant turn cut before its <|im_end|>
    x = IGNORE
    assert assistant_labels(ids, marker, eos) == [x, x, x, x, x, x, x,
                                                  x, x, x, 7, 8, 2, x,
                                                  x, x, x, x, x, x,
                                                  x, x, x, 4, 3]
    assert assistant_labels([1, 20, 11, 5, 2], marker, eos) == [x] * 5


def test_sft_labels_are_the_assistant_content_and_im_end(world):
    tok, _ = world
    answer = "가람 마을의 특산물은 복숭아입니다."
    messages = [{"role": "user", "content": "가람 마을의 특산물은 무엇인가요?"},
                {"role": "assistant", "content": answer}]
    [(ids, labels)] = encode_conversations(tok, [messages], seq_len=128)
    assert ids == tok.encode(tok.chat_text(messages, add_generation_prompt=False))
    kept = [i for i, y in enumerate(labels) if y != IGNORE]
    # the targets are one contiguous run: the answer's tokens then <|im_end|>, nothing else
    assert kept == list(range(kept[0], kept[0] + len(kept)))
    assert [labels[i] for i in kept] == tok.encode(answer) + [tok.eos_id]
    assert ids[: kept[0]] == tok.encode(tok.chat_text(messages[:1], add_generation_prompt=True))
    assert tok.decode([ids[i] for i in kept]) == answer + "<|im_end|>"
    assert all(labels[i] == ids[i] for i in kept)
    assert kept[-1] == len(ids) - 2  # the "\n" after <|im_end|> carries no loss


def test_loss_counts_only_unmasked_targets(world):
    tok, corpus = world
    model = build_model(tok.vocab_size, 0, **TINY).eval()
    [(ids, labels)] = encode_conversations(tok, corpus["sft"][:1], seq_len=64)
    ids, labels = torch.tensor([ids]), torch.tensor([labels])
    logits = model(ids[:, :-1]).logits[0]
    kept = (labels[0, 1:] != IGNORE).nonzero().squeeze(1)
    manual = torch.nn.functional.cross_entropy(logits[kept], labels[0, 1:][kept])
    assert lm_loss(model, ids, labels).item() == pytest.approx(manual.item(), rel=1e-5)
    # changing a user token's target leaves the loss as it was: only the inputs feed it
    other = labels.clone()
    other[0, 3] = IGNORE
    assert lm_loss(model, ids, other).item() == pytest.approx(manual.item(), rel=1e-5)


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    lrs = [lr_at(s, 100, 1.0, 10) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[-1] == pytest.approx(0.1, abs=0.01)


def test_pretrain_loss_decreases_and_logs_progress(world):
    tok, corpus = world
    model = build_model(tok.vocab_size, 0, **TINY)
    val = pack_documents(tok, corpus["val"], 32)
    before = evaluate(model, [(val, val)])
    stream = io.StringIO()
    metrics = pretrain(model, tok, corpus["train"], corpus["val"], steps=30, batch_size=8, seq_len=32, lr=1e-2,
                       seed=0, log=stream, log_every=10)
    assert metrics["val_loss"] < before - 1.0
    assert metrics["val_perplexity"] == pytest.approx(torch.tensor(metrics["val_loss"]).exp().item())
    assert metrics["params"] > 0 and metrics["tokens_per_s"] > 0
    lines = re.findall(r"step (\d+)/30 loss ([\d.]+) tokens/s (\d+)", stream.getvalue())
    assert [int(n) for n, _, _ in lines] == [1, 10, 20, 30]
    assert float(lines[-1][1]) < float(lines[0][1])


def test_pretrain_is_reproducible(world):
    tok, corpus = world
    runs = []
    for _ in range(2):
        model = build_model(tok.vocab_size, 0, **TINY)
        pretrain(model, tok, corpus["train"], corpus["val"], steps=3, batch_size=4, seq_len=16, lr=1e-2, seed=0,
                 log=lambda line: None)
        runs.append(model.state_dict())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])


def test_sft_loss_decreases_on_assistant_tokens_only(world):
    tok, corpus = world
    model = build_model(tok.vocab_size, 0, **TINY)
    pretrain(model, tok, corpus["train"], corpus["val"], steps=10, batch_size=8, seq_len=32, lr=1e-2, seed=0,
             log=lambda line: None)
    lines = []
    metrics = sft(model, tok, corpus["sft"], steps=30, batch_size=8, seq_len=64, lr=5e-3, seed=0, log=lines.append,
                  log_every=10)
    losses = [float(m) for m in re.findall(r"sft step \d+/30 loss ([\d.]+)", "\n".join(lines))]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert metrics["val_conversations"] == 10 and metrics["train_conversations"] == 190
    assert metrics["val_loss"] < 5.0
