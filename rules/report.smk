# Step 7: the report, rendered from the result files.


rule report:
    input:
        template=f"{workflow.basedir}/templates/report.md.j2",
        prompt="results/prompt.json",
        same="results/same.json",
        fed="results/count.json",
        time="results/time.json",
        time_runs="results/time_runs.json",
        kvbytes="results/kvbytes.json",
        temp="results/temp.json",
        temp_answers="results/temp_answers.json",
        topp="results/topp.json",
        topp_sharp="results/topp_sharp.json",
    output:
        report="results/report.md",
    params:
        language=config["report"]["language"],
    log:
        "results/logs/report.log",
    threads: 1
    script:
        "../scripts/report.py"
