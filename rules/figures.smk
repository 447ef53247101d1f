# The report's figures (rules/common.smk's FIGURES): one rule a figure, each made by this loop and
# named by its key, so redrawing a figure never reruns the measurement behind it.

for name, figure in FIGURES.items():

    rule:
        name:
            name
        input:
            data=EXTRA_RESULTS[figure["data"]],
        output:
            figure=report(
                figure["path"],
                caption=f"../report/{name}.rst",
                category="Beyond the lab",
                subcategory=figure["subcategory"],
            ),
        log:
            f"results/logs/{name}.log",
        threads: 1
        resources:
            **LIGHT_JOB,
        params:
            language=config["report"]["language"],
        script:
            "../scripts/figure.py"
