# Grading a class (docs/teaching.md): one job per student of the class sheet (config grade.class_sheet),
# each writing Gradescope's results.json, then the class table, two figures and a class page.
# Every test is a rule of kvlab.grade.check, the same the `check` rule runs, held to an answer key:
# this workflow's own temp, topp and kvbytes results on the same checkpoints (built first if they are
# not yet), or grade.key's folder of them (examples/class/key: then no job of the lab runs).
# Nothing here writes into the lab's results: everything goes under results/class/.
import sys

from kvlab.facts.results import CLASS, CLASS_FOLDER
from kvlab.grade import classroom

GRADE = config["grade"]


# The students of the class sheet, validated the Snakemake catalog's way; none without a sheet.
STUDENTS = {}
if GRADE["class_sheet"]:
    import pandas as pd

    CLASS_SHEET_SCHEMA = workflow.source_path("../schemas/class_sheet.schema.yaml")
    try:
        students = classroom.read_class_sheet(GRADE["class_sheet"])
        validate(pd.DataFrame(students), schema=CLASS_SHEET_SCHEMA)
    except classroom.ClassSheetError as err:
        stop(str(err))
    except WorkflowError:
        schema = lab_config.load_schema(CLASS_SHEET_SCHEMA)
        stop(classroom.sheet_error(students, schema, GRADE["class_sheet"]))
    STUDENTS = {student["student_id"]: student for student in students}
# Snakemake parses this file before it is told the targets: asked for on the command line, `grade`
# without a sheet stops here in one line; asked for otherwise, the rule's input function says it.
if "grade" in sys.argv[1:]:
    if not STUDENTS:
        stop(classroom.NO_SHEET)
    # A folder that is not there scores 0 (no submission); said once, in case it is a typo on the sheet.
    absent = [s for s in STUDENTS.values() if not Path(s["results"]).is_dir()]
    if absent:
        print(
            f"grade: {len(absent)} of {len(STUDENTS)} students have no folder and score 0 (no submission): "
            + ", ".join(f"{s['student_id']} ({s['results']})" for s in absent),
            file=sys.stderr,
        )
CLASS_FIGURES = [figure for figure in FIGURES.values() if figure.category == CLASS]
ANSWER_KEY = lab_config.answer_key(config)


rule grade_student:
    input:
        unpack(
            lambda wildcards: classroom.student_inputs(
                STUDENTS[wildcards.student_id], ANSWER_KEY
            )
        ),
    output:
        results=f"{CLASS_FOLDER}/{{student_id}}/results.json",
    log:
        f"results/logs/class/{{student_id}}.log",
    wildcard_constraints:
        student_id=classroom.STUDENT_ID.pattern,
    threads: 1
    resources:
        **LIGHT_JOB,
    params:
        student=lambda wildcards: STUDENTS[wildcards.student_id],
        points=GRADE["points"],
        temp_tolerance=GRADE["temp_tolerance"],
        max_file_bytes=GRADE["max_file_bytes"],
        temperatures=config["lab"]["temp"]["temperatures"],
        samples=config["lab"]["temp"]["samples"],
        ps=config["lab"]["topp"]["ps"],
    script:
        "../scripts/grade_student.py"


rule grade_class:
    input:
        sheet=GRADE["class_sheet"] or [],
        results=expand(
            f"{CLASS_FOLDER}/{{student_id}}/results.json", student_id=STUDENTS
        ),
    output:
        grades=reported("grades"),
        tests=reported("tests"),
    log:
        "results/logs/class/grade_class.log",
    threads: 1
    resources:
        **LIGHT_JOB,
    script:
        "../scripts/grade_class.py"


rule class_page:
    input:
        results=rules.grade_class.input.results,
        figures=[figure.path for figure in CLASS_FIGURES],
        template=workflow_file("templates/class.html.j2"),
    output:
        class_page=reported("class_page"),
    log:
        "results/logs/class/class_page.log",
    threads: 1
    resources:
        **LIGHT_JOB,
    params:
        language=config["report"]["language"],
        # the page says which answer key the class was held to
        key=GRADE["key"],
    script:
        "../scripts/class_page.py"


rule grade:
    input:
        lambda wildcards: classroom.class_outputs(
            STUDENTS,
            [RESULTS[name].path for name in ("grades", "tests", "class_page")]
            + [figure.path for figure in CLASS_FIGURES],
        ),
    threads: 1
    resources:
        **LIGHT_JOB,
