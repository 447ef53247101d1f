"""Where the time of the lab's last generation step goes (a shrunk copy of the model for the fixed
cost, torch.profiler for the computation), and a decode step at growing context lengths with
MiniMind's torch.cat cache against a preallocated one (and, when configured, a compiled one):
results/step_anatomy.json."""
from kvlab.checkpoints import load_model_input
from kvlab.facts.budget import Budget
from kvlab.io import read_json, write_json_atomic
from kvlab.measure.anatomy import PARTS, STEPS, cache_curve, step_anatomy
from kvlab.measure.steps import use_threads
from kvlab.workflow import log, run


def main(snakemake):
    model, device = load_model_input(snakemake, "pretrain")
    prompt = read_json(snakemake.input.prompt)["ids"]
    p = snakemake.params
    use_threads(p.threads)
    # the curve's fixed work first; the anatomy's rounds then take what is left of the budget
    budget = Budget(getattr(p, "budget_s", None))
    curve = cache_curve(model, prompt, p.contexts, p.warmup, p.repeats, p.max_seconds, p.new_tokens, p.samples,
                        p.seed, device, compile_mode=p.compile)
    log.info("the cache curve: done at %.1f s", budget.spent())
    anatomy = step_anatomy(model, prompt, p.new_tokens, p.warmup, p.repeats, p.rounds, p.profile_repeats, device,
                           budget)
    for name in STEPS:
        step = anatomy[name]
        log.info("%s: %.3f ms unprofiled; fixed %.3f ms + computation %.3f ms = %.3f ms (%+.1f%%, same operators: %s; "
                 "%d operator calls): %s", name, step["step_ms"], step["ms"]["fixed"], step["compute_ms"],
                 step["sum_ms"], 100 * step["sum_of_parts_off"], step["same_operators"], step["operator_calls"],
                 ", ".join(f"{part} {100 * step['shares'][part]:.1f}%" for part in PARTS))
    for kind in curve["kinds"]:
        log.info("%s: %s ms at contexts %s; %.3f ms more per 1,000 tokens", kind,
                 ", ".join(f"{ms:.3f}" for ms in curve[kind]["step_ms"]), p.contexts, curve[kind]["ms_per_1000_context"])
    if "compiled" in curve:
        log.info("compiled (%s): first calls %s s; same next token %s", p.compile,
                 ", ".join(f"{s:.1f}" for s in curve["compiled"]["first_call_s"]), curve["compiled"]["same_next_token"])
    log.info("at %d tokens cat/static %.2f (%.2f-%.2f); identical tokens: %s", p.contexts[-1],
             curve["cat_over_static"]["ratio"], curve["cat_over_static"]["low"], curve["cat_over_static"]["high"],
             curve["identical_tokens"])
    write_json_atomic(snakemake.output.step_anatomy, {"anatomy": anatomy, "curve": curve})


run(snakemake, main)
