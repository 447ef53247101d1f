"""Rule corpus: write the generated Korean corpus (pretraining train/val and SFT chat) as jsonl."""

from kvlab.default_model.corpus import write_corpus
from kvlab.workflow import log, run


def main(snakemake):
    p = snakemake.params
    write_corpus(
        {"pretrain_train": snakemake.output.train, "pretrain_val": snakemake.output.val,
         "sft": snakemake.output.sft},
        seed=p.seed, train_docs=p.train_docs, val_docs=p.val_docs, sft_examples=p.sft_examples,
    )
    log.info("corpus: %d train, %d val documents, %d chat examples (seed %d)",
             p.train_docs, p.val_docs, p.sft_examples, p.seed)


run(snakemake, main)
