"""Pretraining and SFT of the embedded default MiniMind, small enough for two CPU cores.

pretrain: documents become `[bos] text [eos]`, are concatenated and cut into
windows of seq_len + 1 tokens (packing, no padding); next-token loss on every
position. AdamW, linear warm-up then cosine decay, gradient clipping, seeded.

sft: each conversation is rendered with the tokenizer's chat template and
encoded; the loss counts only assistant tokens, i.e. those after
`<|im_start|>assistant\\n` up to and including the `<|im_end|>` that closes
the turn (MiniMind's SFTDataset does the same).

Both log lines "<tag> step N/M loss X tokens/s Y lr Z" (to a callable such as
`logging.Logger.info`, or a stream) and return a dict of metrics.
"""

from __future__ import annotations

import math
import sys
import time

import torch
import torch.nn.functional as F

from kvlab.engine.model import MiniMindConfig, MiniMindForCausalLM, count_parameters

IGNORE = -100
PAD_ID = 0  # <|endoftext|>, MiniMind's pad token; padded positions carry no loss anyway


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------


def build_model(vocab_size: int, seed: int, hidden_size: int = 128, num_hidden_layers: int = 4,
                num_attention_heads: int = 4, num_key_value_heads: int = 2,
                max_position_embeddings: int = 2048, **config_fields) -> MiniMindForCausalLM:
    """A fresh MiniMind with seeded weights: normal(0, 0.02), residual projections
    (o_proj, down_proj) scaled by 1/sqrt(2 * layers), norms at one. `config_fields` go to
    MiniMindConfig as they are (e.g. qk_norm=False, rms_norm_eps=1e-5 for MiniMind2's layout)."""
    config = MiniMindConfig(
        hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
        vocab_size=vocab_size, max_position_embeddings=max_position_embeddings, **config_fields,
    )
    model = MiniMindForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    residual_std = 0.02 / math.sqrt(2 * num_hidden_layers)
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied weights appear once
            if param.dim() == 1:
                param.fill_(1.0)
            else:
                std = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                param.copy_(torch.randn(param.shape, generator=generator) * std)
    return model


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def pack_documents(tokenizer, texts: list[str], seq_len: int) -> torch.Tensor:
    """(n, seq_len + 1) windows of the stream `[bos] doc [eos] [bos] doc [eos] ...`;
    the tail that does not fill a window is dropped."""
    stream: list[int] = []
    for text in texts:
        stream.append(tokenizer.bos_id)
        stream.extend(tokenizer.encode(text))
        stream.append(tokenizer.eos_id)
    n = (len(stream) - 1) // seq_len
    if n < 1:
        raise ValueError(f"{len(stream)} tokens cannot fill one window of {seq_len + 1}")
    data = torch.tensor(stream[: n * seq_len + 1], dtype=torch.long)
    # overlapping by one token: window i predicts stream[i*L + 1 : (i+1)*L + 1]
    return torch.stack([data[i * seq_len: (i + 1) * seq_len + 1] for i in range(n)])


def assistant_labels(ids: list[int], marker: list[int], eos_id: int) -> list[int]:
    """Labels for one encoded conversation: the token id where it is an assistant token
    (after the marker `<|im_start|>assistant\\n`, up to and including eos), IGNORE elsewhere."""
    labels = [IGNORE] * len(ids)
    i, m = 0, len(marker)
    while i < len(ids):
        if ids[i:i + m] == marker:
            j = i + m
            while j < len(ids):
                labels[j] = ids[j]
                j += 1
                if ids[j - 1] == eos_id:
                    break
            i = j
        else:
            i += 1
    return labels


def encode_conversations(tokenizer, conversations: list[list[dict]], seq_len: int) -> list[tuple[list[int], list[int]]]:
    """(ids, labels) per conversation, cut to seq_len tokens; ones with no assistant token left are dropped."""
    marker = tokenizer.encode(tokenizer.bos_token + "assistant\n")
    examples = []
    for messages in conversations:
        ids = tokenizer.encode(tokenizer.chat_text(messages, add_generation_prompt=False))[:seq_len]
        labels = assistant_labels(ids, marker, tokenizer.eos_id)
        if any(label != IGNORE for label in labels[1:]):
            examples.append((ids, labels))
    return examples


def pad_batch(examples, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest in the batch: ids with pad_id, labels with IGNORE."""
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    for row, (x, y) in enumerate(examples):
        ids[row, : len(x)] = torch.tensor(x)
        labels[row, : len(y)] = torch.tensor(y)
    return ids, labels


# ---------------------------------------------------------------------------
# Optimisation
# ---------------------------------------------------------------------------


def lr_at(step: int, steps: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up over `warmup` steps, then cosine from peak down to floor * peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def make_optimizer(model, lr: float, weight_decay: float = 0.1) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8,
    )


def lm_loss(model, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting labels[:, 1:] from ids[:, :-1] (IGNORE skipped)."""
    logits = model(ids[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
                           ignore_index=IGNORE)


def _log(log, line: str) -> None:
    """`log` is a callable taking a line (e.g. logging.Logger.info), a text stream, or None (stderr)."""
    if callable(log):
        log(line)
    else:
        print(line, file=log or sys.stderr, flush=True)


def _train_loop(model, next_batch, steps: int, lr: float, warmup: int, log, log_every: int, tag: str):
    """Shared loop: returns (mean loss of the last 10% of steps, seconds, tokens fed to the model)."""
    optimizer = make_optimizer(model, lr)
    model.train()
    recent: list[float] = []
    tail = max(1, steps // 10)
    start = time.perf_counter()
    window_start, window_tokens, total_tokens = start, 0, 0
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        ids, labels = next_batch()
        loss = lm_loss(model, ids, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        window_tokens += ids[:, :-1].numel()
        total_tokens += ids[:, :-1].numel()
        value = float(loss.detach())
        recent = (recent + [value])[-tail:]
        if (step + 1) % log_every == 0 or step + 1 == steps or step == 0:
            now = time.perf_counter()
            rate = window_tokens / max(now - window_start, 1e-9)
            _log(log, f"{tag} step {step + 1}/{steps} loss {value:.4f} tokens/s {rate:.0f} "
                      f"lr {optimizer.param_groups[0]['lr']:.2e}")
            window_start, window_tokens = now, 0
    seconds = time.perf_counter() - start
    model.eval()
    return sum(recent) / len(recent), seconds, total_tokens


@torch.no_grad()
def evaluate(model, batches) -> float:
    """Token-weighted mean loss over (ids, labels) batches."""
    model.eval()
    total, count = 0.0, 0
    for ids, labels in batches:
        n = int((labels[:, 1:] != IGNORE).sum())
        if n:
            total += float(lm_loss(model, ids, labels)) * n
            count += n
    return total / max(count, 1)


def shuffled_rows(n_rows: int, batch_size: int, seed: int):
    """Row indices, batch after batch: a fresh seeded shuffle whenever the current epoch runs short
    (its leftover rows open the next batch)."""
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    while True:
        if len(order) < batch_size:
            order = order + torch.randperm(n_rows, generator=generator).tolist()
        rows, order = order[:batch_size], order[batch_size:]
        yield rows


def pretrain(model, tokenizer, train_texts: list[str], val_texts: list[str], steps: int, batch_size: int,
             seq_len: int, lr: float, seed: int, log=None, log_every: int = 25,
             warmup_fraction: float = 0.05) -> dict:
    """Next-token training on packed documents; returns final validation loss, perplexity and speed."""
    torch.manual_seed(seed)
    train = pack_documents(tokenizer, train_texts, seq_len)
    val = pack_documents(tokenizer, val_texts, seq_len)
    _log(log, f"pretrain: {len(train_texts)} documents -> {train.shape[0]} windows of {seq_len + 1} tokens "
              f"({train.numel()} tokens); validation {val.shape[0]} windows; {count_parameters(model)} parameters")
    batches = shuffled_rows(train.shape[0], batch_size, seed)

    def next_batch():
        batch = train[next(batches)]
        return batch, batch

    train_loss, seconds, tokens = _train_loop(model, next_batch, steps, lr, max(1, int(steps * warmup_fraction)),
                                              log, log_every, "pretrain")
    val_loss = evaluate(model, [(val[i:i + batch_size], val[i:i + batch_size])
                                for i in range(0, val.shape[0], batch_size)])
    metrics = {
        "val_loss": val_loss,
        "val_perplexity": math.exp(val_loss),
        "train_loss": train_loss,
        "steps": steps,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "tokens_trained": tokens,
        "epochs": tokens / train.numel(),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "params": count_parameters(model),
        "torch_threads": torch.get_num_threads(),
    }
    _log(log, f"pretrain done: val loss {val_loss:.4f} perplexity {metrics['val_perplexity']:.2f} "
              f"tokens/s {metrics['tokens_per_s']:.0f}")
    return metrics


def sft(model, tokenizer, conversations: list[list[dict]], steps: int, batch_size: int, seq_len: int,
        lr: float, seed: int, log=None, log_every: int = 25, val_fraction: float = 0.05,
        warmup_fraction: float = 0.05) -> dict:
    """Fine-tune on chat examples, loss on assistant tokens only; a held-out slice gives a validation loss."""
    torch.manual_seed(seed)
    examples = encode_conversations(tokenizer, conversations, seq_len)
    n_val = min(200, int(len(examples) * val_fraction))
    val, train = examples[:n_val], examples[n_val:]
    if not train:
        raise ValueError("no SFT examples left to train on")
    _log(log, f"sft: {len(train)} training and {len(val)} held-out conversations, at most {seq_len} tokens each; "
              f"{count_parameters(model)} parameters")
    batches = shuffled_rows(len(train), batch_size, seed)

    def next_batch():
        return pad_batch([train[r] for r in next(batches)], PAD_ID)

    train_loss, seconds, tokens = _train_loop(model, next_batch, steps, lr, max(1, int(steps * warmup_fraction)),
                                              log, log_every, "sft")
    val_loss = evaluate(model, [pad_batch(val[i:i + batch_size], PAD_ID) for i in range(0, len(val), batch_size)]) if val else float("nan")
    assistant_tokens = sum(sum(1 for y in labels[1:] if y != IGNORE) for _, labels in train)
    metrics = {
        "val_loss": val_loss,
        "val_perplexity": math.exp(val_loss) if val else float("nan"),
        "train_loss": train_loss,
        "steps": steps,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "train_conversations": len(train),
        "val_conversations": len(val),
        "epochs": steps * batch_size / len(train),
        "assistant_tokens_per_epoch": assistant_tokens,
        "seconds": seconds,
        "conversations_per_s": steps * batch_size / seconds,
        "tokens_trained": tokens,  # padding included: what the model computed on
        "tokens_per_s": tokens / seconds,
        "params": count_parameters(model),
        "torch_threads": torch.get_num_threads(),
    }
    _log(log, f"sft done: held-out assistant loss {val_loss:.4f} in {seconds:.1f}s")
    return metrics
