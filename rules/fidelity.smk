# Beyond the sheet: kvlab's engine held against the user's own MiniMind code (config key
# minimind_src), on the lab's checkpoints, prompts and settings. Included only when the key is set.


rule fidelity:
    input:
        **inputs("tokenizer", "pretrain", "sft", "minimind_src", "prompt"),
    output:
        fidelity=reported("fidelity"),
    log:
        "results/logs/fidelity.log",
    benchmark:
        "results/benchmarks/fidelity.tsv"
    threads: 1
    resources:
        **model_job("pretrain", "sft"),
    params:
        device=config["device"],
        dtype="float32",  # both models compared in float32, whatever the lab runs in
        overrides=config["model_overrides"],
        new_tokens=config["lab"]["same"]["new_tokens"],
        question=config["lab"]["temp"]["question"],
        temperatures=config["lab"]["temp"]["temperatures"],
        samples=config["lab"]["temp"]["samples"],
        max_new_tokens=config["lab"]["temp"]["max_new_tokens"],
        seed=config["lab"]["temp"]["seed"],
        prefixes=[
            config["lab"]["topp"]["prefix"],
            config["lab"]["topp"]["sharp_prefix"],
        ],
        ps=config["lab"]["topp"]["ps"],
    script:
        "../scripts/fidelity.py"
