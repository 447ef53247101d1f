# Beyond the sheet: kvlab's engine held against the user's own MiniMind code (config key
# minimind_src), on the lab's checkpoints, prompts and settings. Included only when the key is set.


rule fidelity:
    input:
        unpack(tokenizer_inputs),
        minimind_src=CONFIGURED_INPUTS["minimind_src"],
        prompt="results/prompt.json",
        pretrain=input_path("pretrain"),
        sft=input_path("sft"),
    output:
        fidelity=report(
            "results/fidelity.json",
            caption="../report/fidelity.rst",
            category="Beyond the lab",
            subcategory="Fidelity to MiniMind",
        ),
    log:
        "results/logs/fidelity.log",
    benchmark:
        "results/benchmarks/fidelity.tsv"
    threads: 1
    params:
        device=config["device"],
        dtype="float32",  # both models compared in float32, whatever the lab runs in
        overrides=config["model_overrides"],
        measured=MEASURED,
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
