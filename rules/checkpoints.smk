# Each checkpoint the config names (pretrain, sft, each `compare` checkpoint), inspected by one job:
# its layout, its config with the source of every field, the head count measured when nobody
# stated it, whether the lab's tokenizer fits (kvlab.checkpoints). Every model job loads its
# checkpoint as the inspection says; a checkpoint the lab cannot use stops the run here.


rule inspect_checkpoint:
    input:
        # the validation text: a head count is measured on it, when the file does not reveal one
        **inputs("tokenizer", "val_data"),
        checkpoint=lambda wildcards: CHECKPOINTS[wildcards.name]["path"],
    output:
        inspection="results/checkpoints/{name}.json",
    log:
        "results/logs/checkpoints/{name}.log",
    wildcard_constraints:
        name="|".join(re.escape(name) for name in CHECKPOINTS),
    # Before any other ready job: a checkpoint the lab cannot use stops the run before model jobs.
    priority: 50
    threads: 1
    resources:
        # on the CPU, whatever the device: it measures a head count with a few forward passes
        **model_job("checkpoint", device=lambda wildcards: "cpu"),
    params:
        config_key=lambda wildcards: CHECKPOINTS[wildcards.name]["config_key"],
        overrides=lambda wildcards: CHECKPOINTS[wildcards.name]["overrides"],
        compared_as=lambda wildcards: CHECKPOINTS[wildcards.name]["compared_as"],
        built=lambda wildcards: CHECKPOINTS[wildcards.name]["built"],
    script:
        "../scripts/inspect_checkpoint.py"
