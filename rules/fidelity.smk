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
    resources:
        # both checkpoints, each run by kvlab's engine and by the user's file: step 1's greedy
        # pair, step 5's samples and step 6's forwards, four times in all
        **model_job(
            ("pretrain", "sft"),
            cost.greedy_pair(PROMPT_LEN, config["lab"]["same"]["new_tokens"], runs=4)
            + cost.sampled(
                cost.chat_len_bound(config["lab"]["temp"]["question"]),
                config["lab"]["temp"]["max_new_tokens"],
                config["lab"]["temp"]["samples"],
                runs=4 * len(config["lab"]["temp"]["temperatures"]),
            )
            + cost.forward(PROMPT_LEN, calls=8),
        ),
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
