# The build's models in the tools a student uses next (kvlab.export): each checkpoint as a transformers
# folder and an F32 GGUF file, each checked where it lands against kvlab's generate on the lab's prompt.
# Only when asked for (`snakemake --cores 1 export`): it needs transformers, gguf and llama-cpp-python.


rule export_model:
    input:
        **inputs("tokenizer", "prompt", "val_data"),
        checkpoint=lambda wildcards: CHECKPOINTS[wildcards.model]["path"],
    output:
        hf=directory("results/export/{model}/hf"),
        gguf="results/export/{model}/{model}.gguf",
        record="results/export/{model}/{model}.json",
    log:
        "results/logs/export_{model}.log",
    wildcard_constraints:
        model="pretrain|sft",
    threads: 1
    resources:
        **LIGHT_JOB,
    params:
        overrides=config["model_overrides"],
        texts=64,
        new_tokens=64,
    script:
        "../scripts/export.py"


rule export:
    input:
        expand("results/export/{model}/{model}.json", model=["pretrain", "sft"]),
    threads: 1
    resources:
        **LIGHT_JOB,
