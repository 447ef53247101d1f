"""Rule tokenizer: byte-level BPE on the generated corpus, saved as a Hugging Face tokenizer folder."""
import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before tokenizers starts its pool: byte-identical output
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from pathlib import Path  # noqa: E402

from kvlab.default_model.bpe import train_tokenizer  # noqa: E402
from kvlab.workflow import log, run  # noqa: E402


def main(snakemake):
    out_dir = Path(snakemake.output.tokenizer).parent
    if Path(snakemake.output.tokenizer_config).parent != out_dir:
        raise ValueError("tokenizer.json and tokenizer_config.json must be in the same folder")
    summary = train_tokenizer([snakemake.input.train, snakemake.input.sft], snakemake.params.vocab_size, out_dir)
    log.info("tokenizer: %s (asked for at most %d)", summary, snakemake.params.vocab_size)


run(snakemake, main)
