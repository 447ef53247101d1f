"""One checkpoint as a transformers folder and a GGUF file, each checked where it lands (kvlab.export)."""
from pathlib import Path

from kvlab.engine.data import read_texts
from kvlab.export.run import ExportError, export
from kvlab.io import read_json
from kvlab.workflow import log, run


def main(snakemake):
    p, out = snakemake.params, snakemake.output
    prompt = read_json(snakemake.input.prompt)["ids"]
    texts = read_texts(snakemake.input.val_data)[: p.texts]
    for to, path in (("hf", out.hf), ("gguf", out.gguf)):
        record = export(Path(snakemake.input.checkpoint), Path(snakemake.input.tokenizer).parent, to, Path(path), prompt,
                        texts, "f32", p.new_tokens, dict(p.overrides))
        log.info("%s: %s the same %d greedy tokens as kvlab's generate%s; the tokenizer differs on %d of %d texts", path,
                 "transformers gives" if to == "hf" else "llama.cpp gives",
                 p.new_tokens, "" if record["same_tokens"] else f" NOT (first: {record['first_difference']})",
                 record["tokenizer_differs"], record["tokenizer_texts"])
        if not record["same_tokens"] or record["tokenizer_differs"]:
            raise ExportError(f"{path}: the export does not hold kvlab's tokens (its record says where)")


run(snakemake, main)
