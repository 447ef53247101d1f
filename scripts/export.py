"""One checkpoint as a transformers folder and a GGUF file, each checked where it lands (kvlab.export),
and the two checks side by side (checks.json, what beyond.md reads)."""
from pathlib import Path

from kvlab.engine.data import read_texts
from kvlab.export.run import SYSTEMS, agreement, export
from kvlab.io import read_json, write_json_atomic
from kvlab.workflow import log, run


def main(snakemake):
    p, out = snakemake.params, snakemake.output
    prompt = read_json(snakemake.input.prompt)["ids"]
    texts = read_texts(snakemake.input.val_data)[: p.texts]
    records = {}
    for to, path in (("hf", out.hf), ("gguf", out.gguf)):
        records[to] = record = export(Path(snakemake.input.checkpoint), Path(snakemake.input.tokenizer).parent, to,
                                      Path(path), prompt, texts, p.file_type if to == "gguf" else "f32",
                                      p.new_tokens, dict(p.overrides))
        # a difference is a finding, not a failure: the record and beyond.md say where
        (log.info if record["same_tokens"] and not record["tokenizer_differs"] else log.warning)(
            "%s: %s %s kvlab's %d greedy tokens%s; its tokenizer differs on %d of %d texts", path, SYSTEMS[to],
            "gives" if record["same_tokens"] else "does NOT give", p.new_tokens,
            "" if record["same_tokens"] else f" (first at {record['first_difference']})",
            record["tokenizer_differs"], record["tokenizer_texts"])
    write_json_atomic(Path(out.checks), agreement(records))


run(snakemake, main)
