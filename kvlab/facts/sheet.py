"""What the lab sheet fixes: the files a student hands in and the headings of their report.

The workflow writes these files (rules/common.smk builds its paths from LAB_RESULTS), the HTML
tables show them, and `check` grades a folder of them. Each has a name, used for it everywhere
(as a Snakemake input or output, and in the templates): the file's stem, but for step 2's
count.json, named `counts` because Snakemake reserves `count` (a method of its input lists)."""

from __future__ import annotations

# Steps 1-6, in order: name -> file name.
LAB_RESULTS = {
    "same": "same.json",
    "counts": "count.json",
    "time": "time.json",
    "kvbytes": "kvbytes.json",
    "temp": "temp.json",
    "topp": "topp.json",
}
# Step 7.
REPORT_FILE = "report.md"
KV_HEADING = "## KV 캐시"  # the section that must hold step 3's speedup and step 4's measured_bytes
REPORT_HEADINGS = (KV_HEADING, "## 온도", "## top-p")
# Everything a student hands in: the six result files and the report.
HANDED_IN = (*LAB_RESULTS.values(), REPORT_FILE)
