"""Grade one student's folder: results/class/{student_id}/results.json in Gradescope's format, each
test a rule of the lab sheet held to the answer key (this workflow's own results, or grade.key's)."""
from kvlab.io import write_json_atomic
from kvlab.grade.check import Settings
from kvlab.grade.classroom import KEY_RESULTS, grade_student, load_key
from kvlab.workflow import log, run


def main(snakemake):
    p = snakemake.params
    key = load_key({name: snakemake.input[name] for name in KEY_RESULTS})
    settings = Settings(temperatures=tuple(p.temperatures), samples=p.samples, ps=tuple(p.ps), key=key,
                        temp_tolerance=p.temp_tolerance, max_bytes=p.max_file_bytes)
    result = grade_student(p.student, settings, p.points)
    for test in result["tests"]:
        log.info("%-60s %s/%s  %s", test["name"][:60], test["score"], test["max_score"], test["output"])
    log.info("%s", result["output"])
    write_json_atomic(snakemake.output.results, result)


run(snakemake, main)
