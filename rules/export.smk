# The build's models in the tools a student uses next (kvlab.export): each checkpoint as a transformers
# folder and a GGUF file (F32 unless extras.export.file_type), each checked where it lands against kvlab's generate on the lab's prompt.
# When asked for (`snakemake --cores 1 export`), or in every build with extras.export.in_build (beyond.md
# then says whether the three systems agree): it needs transformers, gguf and llama-cpp-python.


rule export_model:
    input:
        **inputs("tokenizer", "prompt", "val_data"),
        checkpoint=lambda wildcards: CHECKPOINTS[wildcards.model]["path"],
    output:
        hf=directory(EXPORT_HF),
        gguf=EXPORT_GGUF,
        record=EXPORT_GGUF.replace(".gguf", ".json"),  # the GGUF's record, beside it
        checks=EXPORT_CHECKS,
    log:
        "results/logs/export_{model}.log",
    wildcard_constraints:
        model="|".join(EXPORTED),
    threads: 1
    resources:
        **LIGHT_JOB,
    params:
        overrides=config["model_overrides"],
        file_type=config["extras"]["export"]["file_type"],
        texts=config["extras"]["export"]["texts"],
        new_tokens=config["extras"]["export"]["new_tokens"],
    script:
        "../scripts/export.py"


rule export:
    input:
        expand(EXPORT_CHECKS, model=EXPORTED),
    threads: 1
    resources:
        **LIGHT_JOB,
