"""Beyond the sheet: kvlab's engine against the user's own model_minimind.py (config key minimind_src).
Importing that file runs its code; only this job does."""
from kvlab.io import read_json, write_json_atomic
from kvlab.measure.fidelity import LabSettings, hold_against_minimind
from kvlab.checkpoints import load_model_input
from kvlab.workflow import load_tokenizer_input, log, run


def main(snakemake):
    tokenizer = load_tokenizer_input(snakemake)
    p = snakemake.params
    checkpoints = {}
    for name in ("pretrain", "sft"):
        model, device = load_model_input(snakemake, name)
        checkpoints[name] = (snakemake.input[name], model)
    settings = LabSettings(
        prompt_ids=read_json(snakemake.input.prompt)["ids"], new_tokens=p.new_tokens, question=p.question,
        temperatures=p.temperatures, samples=p.samples, max_new_tokens=p.max_new_tokens, seed=p.seed,
        prefixes=p.prefixes, ps=p.ps,
    )
    result = hold_against_minimind(snakemake.input.minimind_src, checkpoints, tokenizer, settings, device, p.overrides)
    log.info("%s: %s in %d checks", result["minimind"]["layout"],
             "identical" if result["identical"] else f"{len(result['differences'])} differ", result["checks"])
    write_json_atomic(snakemake.output.fidelity, result)


run(snakemake, main)
