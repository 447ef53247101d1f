"""Rule sft: fine-tune the pretrained default model on the generated chat examples."""
import json

from kvlab.engine.checkpoint import load_model, save_checkpoint
from kvlab.io import write_json_atomic
from kvlab.default_model.train import sft
from kvlab.workflow import load_tokenizer_input, log, run


def main(snakemake):
    p = snakemake.params
    tokenizer = load_tokenizer_input(snakemake)
    model = load_model(snakemake.input.pretrain)  # float32, as trained
    with open(snakemake.input.sft, encoding="utf-8") as f:
        conversations = [json.loads(line)["conversations"] for line in f if line.strip()]
    metrics = sft(model, tokenizer, conversations, steps=p.steps, batch_size=p.batch_size, seq_len=p.seq_len,
                  lr=p.lr, seed=p.seed, log=log.info)
    save_checkpoint(model, snakemake.output.model)
    write_json_atomic(snakemake.output.metrics, metrics)


run(snakemake, main)
