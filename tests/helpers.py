"""Small builders shared by the tests."""
import json
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from kvlab.engine.config import MiniMindConfig
from kvlab.engine.model import MiniMindForCausalLM, random_weights

LAB_ARCH = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
# The smallest model the compiled decode step is tested on (compiling costs seconds per shape; tests
# that compile share this one, batch 1, one cache bucket, so the process compiles it once).
TINY_FAST = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, std=0.3)


@contextmanager
def torch_threads(count: int):
    """torch's CPU threads set to `count` inside, restored after."""
    kept = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(kept)


def random_model(seed=0, vocab_size=300, std=0.08, **arch) -> MiniMindForCausalLM:
    """A MiniMind with random weights large enough that greedy output varies."""
    torch.manual_seed(seed)
    config = MiniMindConfig(**{**LAB_ARCH, "vocab_size": vocab_size, "max_position_embeddings": 1024, **arch})
    return random_weights(MiniMindForCausalLM(config), std)


ROOT = Path(__file__).resolve().parents[1]
# Small sizes so the whole lab runs in seconds; the contracts are checked for these P and N.
# The timed generation is long enough (P=65, N=32, median of 5) that the cache is clearly faster,
# since the build's own `check` job fails the build otherwise.
SMALL_LAB = {
    "prompt": {"n_docs": 3, "cut_tokens": 64},
    "same": {"new_tokens": 10},
    "time": {"new_tokens": 32, "warmup": 1, "repeats": 5},
    "kvbytes": {"tokens": 12},
    "temp": {"temperatures": [0.3, 1.5], "samples": 6, "max_new_tokens": 5},
    "topp": {"ps": [0.5, 0.9, 0.99]},
}


def snakemake_cmd(workdir, *args, config=None, cores=2, snakefile=None) -> list[str]:
    """The command that runs the real workflow (or the one at `snakefile`) in `workdir` with `args`
    (flags, targets), `config` (a dict) layered over config.yaml; `cores=None` gives no --cores."""
    snakefile = snakefile or ROOT / "Snakefile"
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(snakefile), "--directory", str(workdir),
           *(["--cores", str(cores)] if cores else []), *args]
    if config:  # last: --configfile takes every word after it
        config_file = workdir / "test-config.yaml"
        config_file.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")  # JSON is YAML
        cmd += ["--configfile", str(config_file)]
    return cmd


def snakemake(workdir, *args, config=None, check=True, cores=2, snakefile=None, env=None):
    """Run the workflow (with the environment `env`, default this one's); returns the CompletedProcess
    (asserting success when `check`)."""
    result = subprocess.run(snakemake_cmd(workdir, *args, config=config, cores=cores, snakefile=snakefile),
                            capture_output=True, text=True, cwd=workdir, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def model_jobs_run(workdir) -> set[str]:
    """The jobs that ran in `workdir` (each writes results/logs/NAME.log), but the checkpoints'
    inspections and the prompt (it loads no model, so it may run beside an inspection)."""
    logs = Path(workdir, "results", "logs")
    return {str(path.relative_to(logs).with_suffix("")) for path in logs.rglob("*.log")
            if path.parent.name != "checkpoints"} - {"prompt"}


def dry_run_jobs(workdir, *targets, config=None, snakefile=None):
    """{rule: count} from the "Job stats" table of a dry run."""
    result = snakemake(workdir, "-n", *targets, config=config, snakefile=snakefile)
    lines = (result.stdout + result.stderr).splitlines()
    if not any(line.startswith("Job stats:") for line in lines):
        return {}
    table = lines[[i for i, line in enumerate(lines) if line.startswith("Job stats:")][0] + 3 :]
    jobs = {}
    for line in table:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        jobs[parts[0]] = int(parts[1])
    return jobs


TINY_ARCH = {"name": "tiny GQA", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 300}
# The steps beyond the lab sheet (rules/extras.smk), as small.
SMALL_EXTRAS = {
    "sweep": {"new_tokens": [2, 5, 9], "warmup": 1, "repeats": 1, "long_from": None},
    "latency": {"warmup": 1, "repeats": 2},
    "capacity": {"contexts": [16, 100], "budgets_gib": [0.001, 2], "dtypes": ["float32", "float16"],
                 "measure_tokens": 4, "architectures": [TINY_ARCH]},
    "topp_curve": {"step": 0.25},
    "temp_curve": {"min": 0.5, "max": 1.5, "step": 0.5},
    "compare": {"prompt_tokens": 20, "new_tokens": 6, "warmup": 0, "repeats": 1, "kv_tokens": 4},
    # the course's 8 validation documents bound the distinct batch and the requests
    "batch": {"prompt_tokens": 20, "new_tokens": 4, "sizes": [1, 2, 4], "warmup": 0, "repeats": 1},
    "kv_waste": {"requests": 6, "prompt_cap": 16, "answer_cap": 8},
    # the 5-request trace from a pool that holds one request in float32 (the lab's shape: 2,048 bytes a token)
    "kv_dtype": {"new_tokens": [4, 12], "minimind_context": 64, "pool_tokens": 32, "repeats": 1},
    # a trace of 5 requests on 2 slots, blocks of 4 tokens; the lab's 65-token prompt before the questions;
    # eager: compiling costs a build's job seconds, and tests/test_serve_trace.py measures the compiled way
    "serving": {"compile": False, "requests": 5, "prompt_min": 4, "prompt_cap": 16, "max_tokens_min": 1, "max_tokens_max": 8,
                "rate": 2.0, "slots": 2, "block_size": 4, "num_blocks": 40, "tight_blocks": 6,
                "max_batched_tokens": 128, "prefix_requests": 2, "question_tokens": 4, "parallel_requests": 1,
                "parallel_n": 2, "repeats": 1, "rate_fractions": [1.0, 2.0], "rate_max_seconds": 5},
    "step_anatomy": {"warmup": 1, "repeats": 2, "rounds": 1, "profile_repeats": 2, "contexts": [64], "samples": 2, "seed": 0,
                     "compile": None},
}


def course_config(course, **lab_changes):
    """A --configfile dict: the course files, SMALL_LAB with per-step changes, SMALL_EXTRAS, and no
    models to compare but the lab's own (tests/test_compare.py adds some)."""
    lab = {step: {**knobs, **lab_changes.get(step, {})} for step, knobs in SMALL_LAB.items()}
    # an unstable timing repeats for at most a quarter second here, not config.yaml's second
    return {**{key: str(path) for key, path in course.items()}, "lab": lab, "extras": SMALL_EXTRAS, "compare": [],
            "timing": {"threads": 1, "max_seconds": 0.25}}


# The files a clone needs to run the workflow (the kvlab package is imported from the installed one).
WORKFLOW_FILES = ("Snakefile", "config.yaml", "rules", "scripts", "templates", "schemas", "report")


def copy_workflow(dest: Path) -> Path:
    """A copy of the workflow's own files in `dest`, as a fresh clone has them (no results)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, dest / name)
    (dest / "docs").mkdir(exist_ok=True)
    return dest


def png_text(path) -> dict:
    """A PNG's text chunks: drawing.save writes the title as Title and every drawn label as Description."""
    from PIL import Image

    with Image.open(path) as image:
        return dict(image.text)


def chromium_and_playwright(what: str):
    """Debian's Chromium and Playwright's driver for it, or the test skips saying which is missing
    and that `what` (the page it would open) is not opened in a browser."""
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip(f"Chromium is not installed (apt-get install chromium): {what} is not opened in a browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip(f'playwright is not installed (pip install -e ".[test]"): {what} is not opened in a browser')
    return executable, sync_playwright


HANGUL_RUN = re.compile("[\uac00-\ud7a3]+")


def assert_hangul_drawn_in_the_pages_own_face(page, selector: str) -> None:
    """The first element matching `selector` in `page`'s main frame holds Hangul, and Chromium drew it in
    the face the page carries (kvlab.present.fonts), not in a font of the machine's: its computed font
    list starts with EMBEDDED_FAMILY, a name no installed font has; that face loads for its Hangul; and
    every font Chromium drew the element's glyphs with (DevTools' CSS.getPlatformFontsForNode) is a web
    font. A machine with Debian's fonts-nanum (CI's, this one's) has a system NanumGothic: a page without
    its own face would draw in that, which the last check tells apart."""
    from kvlab.present.fonts import EMBEDDED_FAMILY, HANGUL_FONT

    element = page.locator(selector).first
    hangul = HANGUL_RUN.findall(element.inner_text())
    assert hangul, f"{selector}: no Hangul in {element.inner_text()[:200]!r}"
    family = element.evaluate("e => getComputedStyle(e).fontFamily")
    assert family.startswith(f'"{EMBEDDED_FAMILY}"'), family
    loaded = page.evaluate("async ([family, text]) => (await document.fonts.load(`16px \"${family}\"`, text))"
                           ".map(face => face.status)", [EMBEDDED_FAMILY, hangul[0]])
    assert loaded == ["loaded"], loaded
    session = page.context.new_cdp_session(page)
    try:
        session.send("DOM.enable")
        session.send("CSS.enable")
        root = session.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
        node = session.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
        fonts = session.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
    finally:
        session.detach()
    assert fonts and all(font["isCustomFont"] and font["familyName"] == HANGUL_FONT for font in fonts), fonts
