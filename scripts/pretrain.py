"""Rule pretrain: train the embedded default MiniMind from scratch on the generated documents."""
from kvlab.engine.checkpoint import save_checkpoint
from kvlab.io import write_json_atomic
from kvlab.engine.data import read_texts
from kvlab.default_model.train import build_model, pretrain
from kvlab.workflow import load_tokenizer_input, log, run


def main(snakemake):
    p = snakemake.params
    tokenizer = load_tokenizer_input(snakemake)
    model = build_model(tokenizer.vocab_size, p.seed, **p.model)
    log.info("model config %s", model.config.to_dict())
    metrics = pretrain(model, tokenizer, read_texts(snakemake.input.train), read_texts(snakemake.input.val),
                       steps=p.steps, batch_size=p.batch_size, seq_len=p.seq_len, lr=p.lr, seed=p.seed,
                       log=log.info)
    save_checkpoint(model, snakemake.output.model)
    write_json_atomic(snakemake.output.metrics, {**metrics, "vocab_size": tokenizer.vocab_size, "model": p.model})


run(snakemake, main)
