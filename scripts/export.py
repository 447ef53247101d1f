"""One checkpoint as a transformers folder and a GGUF file, each checked where it lands (kvlab.export),
and the two checks side by side (checks.json, what beyond.md reads)."""
from pathlib import Path

from kvlab.engine.data import read_texts
from kvlab.export.run import agreement, agrees, export_all, said
from kvlab.io import read_json, write_json_atomic
from kvlab.workflow import log, run


def main(snakemake):
    p, out = snakemake.params, snakemake.output
    outs = {"hf": Path(out.hf), "gguf": Path(out.gguf)}
    records = export_all(Path(snakemake.input.checkpoint), Path(snakemake.input.tokenizer).parent, outs,
                         read_json(snakemake.input.prompt)["ids"], read_texts(snakemake.input.val_data)[: p.texts],
                         p.file_type, p.new_tokens, dict(p.overrides))
    for to, record in records.items():
        # a difference is a finding, not a failure: the record and beyond.md say where
        (log.info if agrees(record) else log.warning)("%s", said(record, outs[to]))
    write_json_atomic(Path(out.checks), agreement(records))


run(snakemake, main)
