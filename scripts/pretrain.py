"""Rule pretrain: train the embedded default MiniMind from scratch on the generated documents."""
import json
from contextlib import redirect_stderr

from kvlab.checkpoint import save_checkpoint
from kvlab.io import write_json_atomic
from kvlab.tokenizer import load_tokenizer
from kvlab.train import build_model, pretrain
from kvlab.workflow import log, run, tokenizer_folder


def read_texts(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def main(snakemake):
    p = snakemake.params
    tokenizer = load_tokenizer(tokenizer_folder(snakemake))
    model = build_model(tokenizer.vocab_size, p.seed, **p.model)
    log.info("model config %s", model.config.to_dict())
    with open(snakemake.log[0], "a", encoding="utf-8") as err, redirect_stderr(err):
        metrics = pretrain(model, tokenizer, read_texts(snakemake.input.train), read_texts(snakemake.input.val),
                           steps=p.steps, batch_size=p.batch_size, seq_len=p.seq_len, lr=p.lr, seed=p.seed,
                           log=log.info)
    save_checkpoint(model, snakemake.output.model)
    write_json_atomic(snakemake.output.metrics, {**metrics, "vocab_size": tokenizer.vocab_size, "model": p.model})


run(snakemake, main)
