# The figures (kvlab.facts.results.FIGURES: the lab's, and the class's of `grade`): one rule a figure,
# each made by this loop and named by its figure, so redrawing a figure never reruns what it draws.

for figure in FIGURES.values():

    rule:
        name:
            figure.rule
        input:
            data=RESULTS[figure.data].path,
        output:
            figure=reported(figure),
        log:
            f"results/logs/{figure.rule}.log",
        threads: 1
        resources:
            **LIGHT_JOB,
        params:
            figure=figure.name,
            language=config["report"]["language"],
        script:
            "../scripts/figure.py"
