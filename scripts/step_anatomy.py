"""Where the time of the lab's last generation step goes (torch.profiler), and a decode step at growing
context lengths with MiniMind's torch.cat cache against a preallocated one: results/step_anatomy.json."""
from kvlab.checkpoints import load_model_input
from kvlab.io import read_json, write_json_atomic
from kvlab.lab.anatomy import PARTS, cache_curve, step_anatomy
from kvlab.lab.steps import use_threads
from kvlab.workflow import log, run


def main(snakemake):
    model, device = load_model_input(snakemake, "pretrain")
    prompt = read_json(snakemake.input.prompt)["ids"]
    p = snakemake.params
    use_threads(p.threads)
    anatomy = step_anatomy(model, prompt, p.new_tokens, p.warmup, p.repeats, p.max_seconds, p.profile_repeats, device)
    for name in ("with_cache_cat", "with_cache_static", "without_cache"):
        step = anatomy[name]
        log.info("%s: %.3f ms (profiled %.3f ms, %.3f ms less the profiler's cost, %d operator calls): %s", name,
                 step["step_ms"], step["profiled_step_ms"], step["corrected_step_ms"], step["operator_calls"],
                 ", ".join(f"{part} {100 * step['shares'][part]:.1f}%" for part in PARTS))
    curve = cache_curve(model, prompt, p.contexts, p.warmup, p.repeats, p.max_seconds, p.new_tokens, p.samples,
                        p.seed, device)
    for kv_cache in ("cat", "static"):
        log.info("%s: %s ms at contexts %s; %.3f ms more per 1,000 tokens", kv_cache,
                 ", ".join(f"{ms:.3f}" for ms in curve[kv_cache]["step_ms"]), p.contexts,
                 curve[kv_cache]["ms_per_1000_context"])
    log.info("at %d tokens cat/static %.2f (%.2f-%.2f); identical tokens: %s", p.contexts[-1],
             curve["cat_over_static"]["ratio"], curve["cat_over_static"]["low"], curve["cat_over_static"]["high"],
             curve["identical_tokens"])
    write_json_atomic(snakemake.output.anatomy, {"anatomy": anatomy, "curve": curve})


run(snakemake, main)
