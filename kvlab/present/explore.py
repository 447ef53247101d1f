"""The lab as a page a student plays with: results/explore.html, one self-contained file.

Three panels, each drawn in the browser from the numbers of this build's result files, which the page
carries as one JSON document (nothing is fetched: its script, style and Hangul font are inline too):

  1. step 1's generation step by step (explore_steps.json): the text so far, the K and V vectors each
     layer computed at the step, with the cache and without it, the tokens fed so far against the
     formulas (kvlab.facts.formulas, computed here for every step), the cache held against
     2 x layers x tokens x KV heads x head_dim x bytes, each step's time (latency.json);
  2. temperature and top-p on the model's own next-token logits after step 6's two prefixes: the page
     redraws softmax(logits / T) and MiniMind's top-p rule (kvlab.engine.sampling.top_p_keep: descending
     cumulative sum, the mask shifted right by one, the top token always kept) in its script; step 5's
     answers grouped (temp_answers.json);
  3. many users at once: the cache per request against a memory budget the student types, worded and
     counted as kv_capacity.csv, and batch.tsv's throughput at each batch size.

The words are the report's language's (kvlab.present.i18n): the template's, and the labels below, which the
script fills in.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from markupsafe import Markup

from kvlab.facts.formulas import BATCH_MODES, MODES, fed_formulas
from kvlab.facts.results import EXPORT_GGUF, EXPORT_HF, EXPORT_RUN
from kvlab.io import read_csv_rows, read_json
from kvlab.present.i18n import N_, check_language, gettext_for
from kvlab.present.fonts import uncovered
from kvlab.present.pages import embedded_font, sandboxed_template

# Every label the script writes, in English (its Korean in the catalog); {names} are filled in by the script.
LABELS = {
    "with_cache": N_("with cache"),
    "without_cache": N_("without cache"),
    "prompt": N_("prompt"),
    "layer": N_("layer"),
    "fed_back": N_("{count} new tokens fed back so far, the last one at this step"),
    "fed_back_again": N_("{count} new tokens fed back so far, all of them again at this step"),
    "below_share": N_("under {share}"),
    "cap_invalid_tokens": N_("Tokens per request: a whole number, 1 or more."),
    "cap_invalid_budget": N_("Memory: a number of GiB, 0 or more."),
    "step_of": N_("step {step} of {steps}"),
    "totals_after": N_("this page's totals after step {step}"),
    "new_token": N_("the token this step produced: {token} (id {id})"),
    "piece": N_("a piece of a character, id {id}"),
    "grid_caption": N_("{mode}, step {step}: {fed} tokens × {layers} layers = {vectors} K and as many V vectors "
                       "computed at this step"),
    "grid_cached": N_("{cached} tokens' K and V read from the cache"),
    "grid_nothing_kept": N_("nothing kept for the next step"),
    "formula_with": N_("tokens fed so far with the cache: P + (N − 1) = {prompt_len} + {previous}"),
    "formula_without": N_("without it: P·N + N(N − 1)/2 = {prompt_len}·{step} + {step}·{previous}/2"),
    "bytes_formula": N_("the cache's bytes: 2 × {layers} layers × {tokens} tokens × {kv_heads} KV heads × {head_dim} × {bytes} bytes"),
    "not_timed": N_("not timed (latency timed {timed} steps)"),
    "equal": N_("equal"),
    "differ": N_("differ"),
    "kept_of": N_("{kept} of {vocab} candidates kept"),
    "kept_mass": N_("they hold {mass} of the probability"),
    "rank_axis": N_("candidates, most probable first (log scale)"),
    "cumulative_axis": N_("cumulative probability"),
    "cut_note": N_("The candidate that crosses p stays; every one after it is cut."),
    "bars_more": N_("The other {more} candidates are not drawn."),
    "fed_axis": N_("tokens fed so far"),
    "time_axis": N_("time so far (ms)"),
    "step_axis": N_("step"),
    "in_budget": N_("fits"),
    "over_budget": N_("does not fit"),
    "empty_answer": N_("(empty answer)"),
    "distinct_of": N_("{distinct} distinct answers of {samples}"),
}


def json_script(data) -> Markup:
    """`data` as JSON to sit inside <script type="application/json">: its characters as they are (the
    font is cut to the page's text), <, > and & escaped so that no text of it can close the element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Markup(text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def generation(opened: dict, count: dict, kvbytes: dict, latency: dict) -> dict:
    """Panel 1: every step of explore_steps.json with the formulas of the tokens fed so far (computed
    here, kvlab.facts.formulas) and the measured time of the step (latency.json, a median of its runs:
    latency times lab.time.new_tokens steps of the same greedy generation, which may be fewer)."""
    prompt_len = opened["prompt_len"]
    steps = []
    for step in opened["steps"]:
        number = step["step"]
        formulas = fed_formulas(prompt_len, number)
        steps.append({
            "id": step["id"],
            "piece": step["piece"],
            **{label: {**step[label], "formula_so_far": formulas[label],
                       "time_s": latency[label]["step_s"][number - 1] if number <= len(latency[label]["step_s"]) else None}
               for label, _ in MODES},
        })
    return {"prompt_len": prompt_len, "new_tokens": opened["new_tokens"], "prompt_text": opened["prompt_text"],
            "model": opened["model"], "steps": steps, "timed_steps": len(latency["with_cache"]["step_s"]),
            "count": count, "kvbytes": kvbytes}


def answer_groups(answers: list[str]) -> list[dict]:
    """Step 5's answers at one temperature, alike ones together, the most frequent first (then in the
    order they were drawn)."""
    counts = Counter(answers)
    first = {answer: answers.index(answer) for answer in counts}
    return [{"text": text, "count": counts[text]} for text in sorted(counts, key=lambda t: (-counts[t], first[t]))]


def sampling(next_token: dict, topp: dict, topp_sharp: dict, curve: list[dict], temp: dict, temp_answers: dict) -> dict:
    """Panel 2: both prefixes' logits (the page computes every probability), the lab's counts to hold the
    page's against (topp.json, topp_sharp.json, topp_curve.csv), and step 5's answers grouped."""
    return {
        "flat": {**next_token["flat"], "lab": topp},
        "sharp": {**next_token["sharp"], "lab": topp_sharp["survivors"]},
        "curve": [{"p": row["p"], "flat": row["flat"], "sharp": row["sharp"]} for row in curve],
        "answers": [{"temperature": key, "distinct": temp[key]["distinct"], "samples": len(texts),
                     "groups": answer_groups(texts)} for key, texts in temp_answers["answers"].items()],
        "question": temp_answers["question"],
    }


CAPACITY_COLUMNS = ("model", "dtype", "layers", "kv_heads", "head_dim", "bytes_per_element", "scale_bytes",
                    "bytes_per_token_formula", "budget_gib",
                    "context_tokens", "bytes_per_request", "max_requests", "cache_tokens")
BATCH_COLUMNS = ("mode", "B", "PP", "TG", "N_KV", "S_TG t/s", "S_TG_low", "S_TG_high", "kv_bytes_measured")


def serving(capacity: list[dict], batch: list[dict]) -> dict:
    """Panel 3: kv_capacity.csv's rows (the page counts the requests that fit as it does) and batch.tsv's
    throughput at each batch size, in both of its modes."""
    return {"capacity": [{key: row[key] for key in CAPACITY_COLUMNS} for row in capacity],
            "batch": [{key: row[key] for key in BATCH_COLUMNS} for row in batch if row["mode"] in BATCH_MODES]}


def page_data(results: dict, language: str) -> dict:
    """Everything the page's script reads, from the result files named as in kvlab.facts.results.EXPLORE_READS."""
    check_language(language)
    translate = gettext_for(language)
    loaded = {name: read_csv_rows(path) if str(path).endswith((".csv", ".tsv")) else read_json(path)
              for name, path in results.items()}
    opened = loaded["explore_steps"]
    return {
        "lang": language,
        "labels": {key: translate(text) for key, text in LABELS.items()},
        "generation": generation(opened, loaded["counts"], loaded["kvbytes"], loaded["latency"]),
        "sampling": sampling(opened["next_token"], loaded["topp"], loaded["topp_sharp"], loaded["topp_curve"],
                             loaded["temp"], loaded["temp_answers"]),
        "serving": serving(loaded["kv_capacity"], loaded["batch"]),
    }


def render_explore(template_path, script_path, style_path, results: dict, font_path, language: str) -> str:
    """results/explore.html in `language`: the template rendered with the page's data, script and style
    inline, then with the Hangul font cut to the characters of the page (kvlab.present.pages.embedded_font)."""
    data = page_data(results, language)
    template = sandboxed_template(template_path, autoescape=True, language=language)
    context = {"lang": language, "data": json_script(data), "model": data["generation"]["model"],
               "prompt_len": data["generation"]["prompt_len"], "new_tokens": data["generation"]["new_tokens"],
               "prefixes": {key: data["sampling"][key]["prefix"] for key in ("flat", "sharp")},
               "question": data["sampling"]["question"],
               # the SFT model (it answers) in transformers and llama.cpp, once `snakemake --cores 1 export` ran
               "exported": {to: EXPORT_RUN[to].format(out=path.format(model="sft"))
                            for to, path in (("hf", EXPORT_HF), ("gguf", EXPORT_GGUF))},
               "script": Markup(Path(script_path).read_text(encoding="utf-8")),
               "style": Markup(Path(style_path).read_text(encoding="utf-8"))}
    # the model's own texts (its tokens, answers, prompt) the embedded font cannot draw: the page says so
    missing = [char for char in uncovered(font_path, strings(data["generation"], data["sampling"]))
               if char != "\ufffd"]  # a byte-level piece's stand-in is no character of the model's
    context["missing_glyphs"] = {"count": len(missing), "examples": " ".join(missing[:MISSING_SHOWN])}
    text = template.render(**context, font="")
    return template.render(**context, font=embedded_font(font_path, text))


# How many of the characters the embedded font lacks the page names.
MISSING_SHOWN = 8


def strings(*values) -> list[str]:
    """Every string inside `values` (dicts, lists and strings, as JSON holds them), keys aside."""
    found: list[str] = []
    for value in values:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            found.extend(strings(*value.values()))
        elif isinstance(value, (list, tuple)):
            found.extend(strings(*value))
    return found
