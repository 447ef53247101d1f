"""Step 6: survivors of MiniMind's top-p rule after a flat prefix, and after a sharp one."""
from kvlab.io import write_json_atomic
from kvlab.measure.steps import next_token_logits, top_p_survivors
from kvlab.checkpoints import load_model_input
from kvlab.workflow import load_tokenizer_input, log, run


def main(snakemake):
    tokenizer = load_tokenizer_input(snakemake)
    model, device = load_model_input(snakemake, "pretrain")
    p = snakemake.params
    flat = top_p_survivors(next_token_logits(model, tokenizer, p.prefix, device), p.ps)
    sharp = top_p_survivors(next_token_logits(model, tokenizer, p.sharp_prefix, device), p.ps)
    log.info("%s: %s; %s: %s", p.prefix, flat, p.sharp_prefix, sharp)
    write_json_atomic(snakemake.output.topp_sharp, {"prefix": p.sharp_prefix, "survivors": sharp, "flat_prefix": p.prefix})
    write_json_atomic(snakemake.output.topp, flat)


run(snakemake, main)
