"""One model of `compare`: the lab's cost steps on the lab's prompt cut to P tokens."""
from kvlab.checkpoints import load_inspected
from kvlab.facts.budget import Budget
from kvlab.engine.device import resolve_device, resolve_dtype
from kvlab.io import read_json, write_json_atomic
from kvlab.measure.capacity import architecture_model
from kvlab.measure.cost import measure_cost
from kvlab.measure.steps import use_threads
from kvlab.workflow import log, run


def main(snakemake):
    p = snakemake.params
    entry, settings = p.entry, p.settings
    prompt_ids = read_json(snakemake.input.prompt)["ids"][: settings["prompt_tokens"]]
    if "architecture" in entry:
        device = resolve_device(p.device)
        model = architecture_model(entry["architecture"], positions=len(prompt_ids) + settings["new_tokens"])
        model = model.to(device=device, dtype=resolve_dtype(p.dtype))
        log.info("%s: seeded random weights, %s", entry["name"], model.config.to_dict())
    else:
        inspection = read_json(snakemake.input.checkpoint_inspected)
        model, device = load_inspected(snakemake.input.checkpoint, inspection, p.device, p.dtype)
    use_threads(p.threads)
    try:
        cost = measure_cost(model, prompt_ids, settings["new_tokens"], settings["warmup"], settings["repeats"],
                            p.max_seconds, settings["kv_tokens"], p.seed, device, Budget(settings.get("budget_s")))
    except ValueError as err:
        raise ValueError(f"compare entry '{entry['name']}': {err}") from None
    log.info("%s: speedup %.2f (token ratio %.1f), fit %.3f ms + %.3f us/token", entry["name"], cost["speedup"],
             cost["token_ratio"], cost["fit_fixed_s"] * 1e3, cost["fit_per_token_s"] * 1e6)
    write_json_atomic(snakemake.output.cost, {"name": entry["name"], **cost})


run(snakemake, main)
