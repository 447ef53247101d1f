# Grading a class (docs/teaching.md): one job per student of the class sheet (config grade.class_sheet),
# each writing Gradescope's results.json, then the class table, two figures and a class page.
# Every test is a rule of kvlab.lab.check, the same the `check` rule runs on this build, here held to
# an answer key: this workflow's own temp, topp and kvbytes results on the same checkpoints.
# Nothing here writes into the lab's results: everything goes under results/class/.
rule grade_student:
    input:
        unpack(student_inputs),
    output:
        results=f"{CLASS}/{{student_id}}/results.json",
    log:
        f"results/logs/class/{{student_id}}.log",
    wildcard_constraints:
        student_id=grading.STUDENT_ID.pattern,
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
        results=expand(f"{CLASS}/{{student_id}}/results.json", student_id=STUDENTS),
    output:
        grades=report(
            f"{CLASS}/grades.csv",
            caption="../report/class_grades.rst",
            category="Class",
        ),
        tests=report(
            f"{CLASS}/tests.csv",
            caption="../report/class_tests.rst",
            category="Class",
        ),
    log:
        "results/logs/class/grade_class.log",
    threads: 1
    resources:
        **LIGHT_JOB,
    script:
        "../scripts/grade_class.py"


for name, figure in CLASS_FIGURES.items():

    rule:
        name:
            name
        input:
            data=rules.grade_class.output[figure["data"]],
        output:
            figure=report(
                figure["path"], caption=f"../report/{name}.rst", category="Class"
            ),
        log:
            f"results/logs/class/{name}.log",
        threads: 1
        resources:
            **LIGHT_JOB,
        params:
            language=config["report"]["language"],
        script:
            "../scripts/figure.py"


rule class_page:
    input:
        results=rules.grade_class.input.results,
        figures=[figure["path"] for figure in CLASS_FIGURES.values()],
        template=workflow_file("templates/class.html.j2"),
    output:
        page=report(
            f"{CLASS}/class.html", caption="../report/class_page.rst", category="Class"
        ),
    log:
        "results/logs/class/class_page.log",
    threads: 1
    resources:
        **LIGHT_JOB,
    params:
        language=config["report"]["language"],
    script:
        "../scripts/class_page.py"


rule grade:
    input:
        class_outputs,
    threads: 1
    resources:
        **LIGHT_JOB,
