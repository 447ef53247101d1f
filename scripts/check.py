"""Self-check: verify a results folder against the lab sheet's rules; fail when any rule fails.

This build's folder is held to each file's shape and its own numbers; another folder, to the answer
key its inputs name (temp, topp and kvbytes: grade's), within grade's temp_tolerance. The output
(results/check.json, or results/check/NAME.json for another folder) holds every verdict, and the job
ends well either way: a failed check is the run's verdict, not a broken job, so the workflow's
onsuccess (rules/extras.smk) ends the run on one line saying which rules failed, exits non-zero and
removes the output, so the next run checks again. The verdicts are also written to the rule's log
folder, where they survive that."""
from kvlab.grade.check import Settings, check_results, verdict_table
from kvlab.grade.classroom import KEY_RESULTS, load_key
from kvlab.io import write_json_atomic
from kvlab.workflow import log, run


def main(snakemake):
    p = snakemake.params
    against_key = set(KEY_RESULTS) <= set(snakemake.input.keys())
    key = load_key({name: snakemake.input[name] for name in KEY_RESULTS}) if against_key else None
    settings = Settings(temperatures=tuple(p.temperatures), samples=p.samples, ps=tuple(p.ps), key=key,
                        temp_tolerance=p.temp_tolerance if against_key else 0, max_bytes=p.max_file_bytes)
    result = check_results(p.results_dir, settings)
    write_json_atomic(snakemake.log.verdicts, result)
    write_json_atomic(snakemake.output.check, result)
    table = verdict_table(result)
    log.info("\n%s", table)
    print(table, flush=True)
    if against_key:
        # a failed job's output is deleted: its verdicts stay in the log folder
        # a failed check's output is removed at the end of the run: its verdicts stay in the log folder
        kept = snakemake.output.check if result["ok"] else snakemake.log.verdicts
        print(f"held to the answer key: {', '.join(snakemake.input[name] for name in KEY_RESULTS)}; "
              f"verdicts in {kept}", flush=True)


run(snakemake, main)
