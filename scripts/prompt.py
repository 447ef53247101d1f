"""Step 1's prompt: first n_docs validation texts, joined, encoded, cut, bos in front."""
from kvlab.io import write_json_atomic
from kvlab.engine.data import read_texts
from kvlab.measure.prompt import make_prompt
from kvlab.workflow import load_tokenizer_input, log, run


def main(snakemake):
    tokenizer = load_tokenizer_input(snakemake)
    texts = read_texts(snakemake.input.val_data, snakemake.params.n_docs)
    prompt = make_prompt(tokenizer, texts, snakemake.params.cut_tokens)
    log.info("prompt_len %d from %d documents", prompt["prompt_len"], prompt["n_docs"])
    write_json_atomic(snakemake.output.prompt, prompt)


run(snakemake, main)
