"""Rule sft: fine-tune the pretrained default model on the generated chat examples."""
import json
from contextlib import redirect_stderr

from kvlab.checkpoint import load_model, save_checkpoint
from kvlab.io import write_json_atomic
from kvlab.tokenizer import load_tokenizer
from kvlab.train import sft
from kvlab.workflow import log, run, tokenizer_folder


def main(snakemake):
    p = snakemake.params
    tokenizer = load_tokenizer(tokenizer_folder(snakemake))
    model = load_model(snakemake.input.pretrain)  # float32, as trained
    with open(snakemake.input.sft, encoding="utf-8") as f:
        conversations = [json.loads(line)["conversations"] for line in f if line.strip()]
    with open(snakemake.log[0], "a", encoding="utf-8") as err, redirect_stderr(err):
        metrics = sft(model, tokenizer, conversations, steps=p.steps, batch_size=p.batch_size, seq_len=p.seq_len,
                      lr=p.lr, seed=p.seed, log=log.info)
    save_checkpoint(model, snakemake.output.model)
    write_json_atomic(snakemake.output.metrics, metrics)


run(snakemake, main)
