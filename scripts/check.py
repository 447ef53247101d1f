"""Self-check: verify a results folder against the lab sheet's rules; fail when any rule fails.

results/check.json holds every verdict. Snakemake deletes the output of a failed job, so the
verdicts are also written to the rule's log folder, where they survive a failure."""
from kvlab.grade.check import CheckFailed, Settings, check_results, failure_message, verdict_table
from kvlab.io import write_json_atomic
from kvlab.workflow import log, run


def main(snakemake):
    p = snakemake.params
    settings = Settings(temperatures=tuple(p.temperatures), samples=p.samples, ps=tuple(p.ps),
                        max_bytes=p.max_file_bytes)
    result = check_results(p.results_dir, settings)
    write_json_atomic(snakemake.log.verdicts, result)
    write_json_atomic(snakemake.output.check, result)
    table = verdict_table(result)
    log.info("\n%s", table)
    print(table, flush=True)
    if not result["ok"]:
        raise CheckFailed(failure_message(result))


run(snakemake, main)
