"""The lab as a page a student plays with (results/explore.html): what its job measures, on a random model;
and the page of the tests' shared build opened in Chromium from disk with the network off, every control moved
and the numbers it shows held against the build's result files. One page load for the module."""
import json
import re

import pytest
import torch

from kvlab.engine.sampling import top_p_keep
from kvlab.engine.tokenizer import load_tokenizer
from kvlab.facts.formulas import fed_formulas
from kvlab.facts.results import EXPLORE_READS, EXPLORE_TEMPLATE, RESULTS
from kvlab.io import read_csv_rows
from kvlab.measure import explore, steps
from kvlab.present import explore as page_module
from kvlab.present.fonts import hangul_font_path

from helpers import ROOT, chromium_and_playwright, random_model

HANGUL = re.compile("[\uac00-\ud7a3]")


# --- the job's measurements, on a random model --------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


@pytest.fixture(scope="module")
def opened(tokenizer):
    model = random_model(3, vocab_size=tokenizer.vocab_size)
    prompt = [tokenizer.bos_id] + tokenizer.encode("민수는 아침에 가람 마을의 시장에 갔다.")
    opened = steps.generation_opened(model, prompt, 7, "cpu")
    return model, prompt, explore.steps_opened(opened, model, tokenizer, prompt)


def test_steps_one_and_two_read_from_the_opened_generation_are_the_plain_ones(tokenizer):
    """`same` opens the generation once (hooks on every layer) and reads same.json and count.json from
    it: they equal two plain generations' counted by wrapping forward."""
    model = random_model(5, vocab_size=tokenizer.vocab_size)
    prompt = [tokenizer.bos_id] + tokenizer.encode("가람 마을의 시장")
    opened = steps.generation_opened(model, prompt, 6, "cpu")
    assert steps.opened_same_and_count(opened) == steps.greedy_with_and_without_cache(model, prompt, 6, "cpu")
    assert [entry["fed"] for entry in opened["steps"]["without_cache"]] == list(range(len(prompt), len(prompt) + 6))


def test_the_page_refuses_a_generation_whose_modes_differ_or_another_prompts(opened, tokenizer):
    model, prompt, _ = opened
    raw = steps.generation_opened(model, prompt, 3, "cpu")
    differing = {**raw, "new_ids": {**raw["new_ids"], "without_cache": raw["new_ids"]["with_cache"][::-1] + [0]}}
    with pytest.raises(ValueError, match="same_ids is false"):
        explore.steps_opened(differing, model, tokenizer, prompt)
    with pytest.raises(ValueError, match="not this prompt's"):
        explore.steps_opened(raw, model, tokenizer, prompt[:-1])


def test_each_step_feeds_computes_and_keeps_what_the_formulas_say(opened):
    model, prompt, data = opened
    p, n = len(prompt), 7
    config = model.config
    assert data["prompt_len"] == p and data["new_tokens"] == n and len(data["steps"]) == n
    assert data["ids"] == steps.greedy_new_ids(model, torch.tensor([prompt]), n, use_cache=True)
    assert data["model"]["kv_bytes_per_token"] == config.kv_bytes_per_token("float32") == 2 * 4 * 2 * 32 * 4
    for number, step in enumerate(data["steps"], start=1):
        with_cache, without_cache = step["with_cache"], step["without_cache"]
        assert with_cache["fed"] == (p if number == 1 else 1)
        assert without_cache["fed"] == p + number - 1
        # every layer computed K and V for exactly the tokens fed (forward hooks on k_proj and v_proj)
        assert with_cache["kv_computed"] == [with_cache["fed"]] * config.num_hidden_layers
        assert without_cache["kv_computed"] == [without_cache["fed"]] * config.num_hidden_layers
        assert with_cache["cache_tokens"] == [p + number - 1] * config.num_hidden_layers
        assert with_cache["cache_bytes"] == (p + number - 1) * config.kv_bytes_per_token("float32")
        assert without_cache["cache_tokens"] == [0] * config.num_hidden_layers and without_cache["cache_bytes"] == 0
        for label in ("with_cache", "without_cache"):
            fed_so_far = sum(entry[label]["fed"] for entry in data["steps"][:number])
            assert fed_so_far == fed_formulas(p, number)[label]
    # the hooks are gone after the job
    assert not any(layer.self_attn.k_proj._forward_hooks for layer in model.model.layers)


def test_the_pieces_add_up_to_the_decoded_text(opened, tokenizer):
    _, prompt, data = opened
    assert "".join(step["piece"] for step in data["steps"]) == tokenizer.decode(data["ids"]).rstrip(explore.BROKEN)
    assert data["prompt_text"] == tokenizer.decode(prompt)


def test_a_prefix_carries_every_logit_and_the_labels_of_the_most_probable(tokenizer):
    model = random_model(4, vocab_size=tokenizer.vocab_size)
    data = explore.prefix_logits(model, tokenizer, "민수는", 12, "cpu")
    logits = steps.next_token_logits(model, tokenizer, "민수는", "cpu")[0]
    assert data["logits"] == logits.tolist() and len(data["logits"]) == tokenizer.vocab_size
    assert [int(key) for key in data["labels"]] == torch.argsort(logits, descending=True, stable=True)[:12].tolist()
    assert all(text is None or explore.BROKEN not in text for text in data["labels"].values())


def test_answer_groups_put_alike_answers_together_most_frequent_first():
    groups = page_module.answer_groups(["b", "a", "b", "", "a", "b", "c"])
    assert groups == [{"text": "b", "count": 3}, {"text": "a", "count": 2}, {"text": "", "count": 1},
                      {"text": "c", "count": 1}]


def test_the_data_cannot_close_its_script_element():
    text = str(page_module.json_script({"answer": "</script><script>alert(1)</script> & 가람\u2028"}))
    assert "</" not in text and "<" not in text and "&" not in text
    assert json.loads(text) == {"answer": "</script><script>alert(1)</script> & 가람\u2028"}


# --- the page of the shared build ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(course_build):
    return course_build / "results"


def load(results, name):
    return json.loads((results / RESULTS[name].path.removeprefix("results/")).read_text(encoding="utf-8"))


def number(text: str) -> float:
    """The first number of a text the page shows ("14,880", "411,648 B (402.0 KiB)", "12.28")."""
    return float(re.search(r"-?[\d,]+(?:\.\d+)?", text).group(0).replace(",", ""))


@pytest.fixture(scope="module")
def browser_page(built):
    """results/explore.html opened from disk in Chromium with the network off: a context offline, every request
    but the page's own file aborted and recorded. Yields (page, requests, console messages)."""
    executable, sync_playwright = chromium_and_playwright("results/explore.html")
    page_url = (built / "explore.html").as_uri()
    requests, messages = [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            context = browser.new_context(offline=True, viewport={"width": 1366, "height": 900})
            context.route("**/*", lambda route: route.continue_() if route.request.url == page_url else route.abort())
            page = context.new_page()
            page.on("request", lambda request: requests.append(request.url))
            page.on("console", lambda message: messages.append(f"{message.type}: {message.text}"))
            page.on("pageerror", lambda error: messages.append(f"pageerror: {error}"))
            page.goto(page_url)
            page.wait_for_selector("body[data-ready=true]", timeout=30_000)
            yield page, requests, messages, page_url
        finally:
            browser.close()


def test_the_page_opens_offline_with_three_panels_and_asks_for_nothing(browser_page, built):
    page, requests, messages, page_url = browser_page
    assert requests == [page_url], requests  # no request left the page: not a font, not a script
    assert not messages, messages
    for panel in ("steps", "sampling", "serving"):
        assert page.locator(f"#{panel}").is_visible()
    assert page.locator("h2").all_inner_texts()[0].startswith("1.")
    # the report's language (ko), in the page's own Hangul font whatever the machine has
    assert HANGUL.search(page.locator("#steps-title").inner_text())
    family = page.locator("h1").evaluate("h => getComputedStyle(h).fontFamily")
    assert family.startswith('"kvlab NanumGothic"'), family
    assert page.evaluate("document.fonts.check('16px \"kvlab NanumGothic\"', '캐시 민수는')")
    html = (built / "explore.html").read_text(encoding="utf-8")
    assert "default-src 'none'" in html and not re.search(r"(src|href)=\"https?:", html)


def step_numbers(page, mode: str) -> dict:
    cells = {key: page.locator(f"#{key}-{mode}").inner_text()
             for key in ("fed", "total", "formula", "held", "bytes", "bytes-formula", "time", "time-total")}
    return {key: number(text) if re.search(r"\d", text) else None for key, text in cells.items()}


def grid_counts(page) -> list[dict]:
    """Each layer's cells of the K/V grid, by kind."""
    return page.evaluate("""() => [...document.querySelectorAll('#grid-rows .cells')].map(row => {
        const counts = {new: 0, again: 0, cached: 0, empty: 0};
        for (const cell of row.children) {
            const kind = ['new', 'again', 'cached'].find(k => cell.classList.contains(k)) || 'empty';
            counts[kind] += 1;
        }
        return counts;
    })""")


def test_every_step_shows_the_measured_tokens_cache_and_time_against_the_formulas(browser_page, built):
    page, *_ = browser_page
    opened, count, latency = load(built, "explore_steps"), load(built, "counts"), load(built, "latency")
    p, n = opened["prompt_len"], opened["new_tokens"]
    per_token = opened["model"]["kv_bytes_per_token"]
    assert opened["ids"] == load(built, "same")["ids"] and n == count["new_tokens"]
    slider = page.locator("#step")
    for mode in ("with_cache", "without_cache"):
        page.locator(f"input[name=mode][value={mode}]").check()
        for number_ in range(1, n + 1):
            slider.fill(str(number_))
            step = opened["steps"][number_ - 1]
            for label in ("with_cache", "without_cache"):
                shown = step_numbers(page, label)
                fed_so_far = sum(entry[label]["fed"] for entry in opened["steps"][:number_])
                held = step[label]["cache_tokens"][0]
                assert shown["fed"] == step[label]["fed"]
                assert shown["total"] == fed_so_far == shown["formula"] == fed_formulas(p, number_)[label]
                assert shown["held"] == held and shown["bytes"] == step[label]["cache_bytes"] == held * per_token
                assert shown["bytes-formula"] == held * per_token
                assert shown["time"] == pytest.approx(latency[label]["step_s"][number_ - 1] * 1e3, abs=0.0051)
                assert shown["time-total"] == pytest.approx(sum(latency[label]["step_s"][:number_]) * 1e3, abs=0.0051)
            # the grid: one cell a token and layer, by what the layer computed at this step
            layers = grid_counts(page)
            assert len(layers) == opened["model"]["layers"]
            for layer, cells in enumerate(layers):
                computed = step[mode]["kv_computed"][layer]
                assert sum(cells.values()) == p + n - 1
                if mode == "with_cache":
                    assert cells["new"] == computed == (p if number_ == 1 else 1)
                    assert cells["cached"] == step[mode]["cache_tokens"][layer] - computed and cells["again"] == 0
                else:
                    assert cells["new"] + cells["again"] == computed == p + number_ - 1
                    assert cells["new"] == (p if number_ == 1 else 1) and cells["cached"] == 0
    # after the last step, the totals are count.json's
    assert number(page.locator("#count-page-with_cache").inner_text()) == count["fed_with_cache"]
    assert number(page.locator("#count-page-without_cache").inner_text()) == count["fed_without_cache"]
    page.locator("input[name=mode][value=with_cache]").check()


def test_the_bytes_of_step_4_are_the_formula_the_page_computes(browser_page, built):
    page, *_ = browser_page
    kvbytes = load(built, "kvbytes")
    shown = number(page.locator("#kvbytes-page").inner_text())
    assert shown == kvbytes["formula_bytes"] == kvbytes["measured_bytes"]
    assert str(kvbytes["tokens"]) in page.locator("#kvbytes-check").inner_text()


def test_the_step_controls_answer_the_keyboard(browser_page):
    page, *_ = browser_page
    page.locator("#step").fill("1")
    page.locator("#step").focus()
    page.keyboard.press("ArrowRight")
    assert page.locator("#step").input_value() == "2" and "2" in page.locator("#step-label").inner_text()
    page.locator("#step-next").focus()
    page.keyboard.press("Enter")
    assert page.locator("#step").input_value() == "3"
    page.locator("#step-prev").focus()
    page.keyboard.press("Space")
    assert page.locator("#step").input_value() == "2"
    # every control of the page is reached by Tab
    controls = page.evaluate("""() => [...document.querySelectorAll('input, select, button')]
        .map(c => ({id: c.id || c.value, tab: c.tabIndex, disabled: c.disabled}))""")
    assert controls and all(control["tab"] >= 0 and not control["disabled"] for control in controls), controls


def shown_kept(page, prefix: str) -> int:
    return int(number(page.locator(f"#kept-{prefix} .kept-count").inner_text()))


def test_topp_counts_at_the_sheets_p_equal_topp_json_and_the_curve(browser_page, built):
    page, *_ = browser_page
    topp, sharp = load(built, "topp"), load(built, "topp_sharp")["survivors"]
    curve = {row["p"]: row for row in read_csv_rows(built / "topp_curve.csv")}
    page.locator("#temperature").fill("1")
    for key in topp:  # the slider moved to each of the sheet's p
        page.locator("#top-p").fill(key)
        assert page.locator("#top-p-value").inner_text() == f"{float(key):.2f}"
        assert shown_kept(page, "flat") == topp[key] == curve[float(key)]["flat"]
        assert shown_kept(page, "sharp") == sharp[key] == curve[float(key)]["sharp"]
    for key in topp:  # and the sheet's buttons
        page.locator(f"#sheet-buttons button[data-p='{key}']").click()
        assert shown_kept(page, "flat") == topp[key] and page.locator("#temperature").input_value() == "1"
    for p, row in curve.items():  # every p of the curve (at p = 1 generate skips top-p: all stay)
        page.locator("#top-p").fill(str(p))
        expected = {"flat": row["vocab_size"], "sharp": row["vocab_size"]} if p >= 1 else row
        assert (shown_kept(page, "flat"), shown_kept(page, "sharp")) == (expected["flat"], expected["sharp"]), p
    cells = page.locator("#topp-check tbody td.disagree")
    assert cells.count() == 0 and page.locator("#topp-check tbody td.agree").count() == 2 * len(topp)


@pytest.mark.parametrize("temperature, p", [(0.5, 0.9), (1.5, 0.5), (2.0, 0.99), (0.1, 0.3)])
def test_temperature_reshapes_the_distribution_as_softmax_of_logits_over_t(browser_page, built, temperature, p):
    """The page's softmax(logits / T) and top-p cut, against kvlab.engine.sampling's rule on the same logits."""
    page, *_ = browser_page
    opened = load(built, "explore_steps")
    page.locator("#temperature").fill(str(temperature))
    page.locator("#top-p").fill(str(p))
    for prefix in ("flat", "sharp"):
        logits = torch.tensor([opened["next_token"][prefix]["logits"]]) / temperature
        assert shown_kept(page, prefix) == int(top_p_keep(logits, p).sum()), (prefix, temperature, p)
        probabilities = torch.softmax(logits.double(), dim=-1)[0].sort(descending=True).values
        bars = page.locator(f"#bars-{prefix} li")
        assert bars.count() == len(opened["next_token"][prefix]["labels"])
        shown = number(bars.first.locator(".prob").inner_text())
        assert shown == pytest.approx(float(probabilities[0]) * 100, abs=0.051)
        cut = page.locator(f"#bars-{prefix} li.cut").count()
        assert cut == max(0, bars.count() - shown_kept(page, prefix))
    page.locator("#temperature").fill("1")


def test_the_answers_are_grouped_with_temp_json_s_distinct_counts(browser_page, built):
    page, *_ = browser_page
    temp, answers = load(built, "temp"), load(built, "temp_answers")["answers"]
    columns = page.locator("#answers > div")
    assert columns.count() == len(temp)
    for key, entry in temp.items():
        column = page.locator(f"#answers > div[data-temperature='{key}']")
        assert number(column.locator("output.distinct").inner_text()) == entry["distinct"]
        counts = [int(number(text)) for text in column.locator(".times").all_inner_texts()]
        assert len(counts) == entry["distinct"] and sum(counts) == len(answers[key])


def test_the_budget_counts_requests_as_kv_capacity_does(browser_page, built):
    page, *_ = browser_page
    for row in read_csv_rows(built / "kv_capacity.csv"):
        page.locator("#cap-model").select_option(row["model"])
        page.locator("#cap-dtype").select_option(row["dtype"])
        page.locator("#cap-tokens").fill(str(row["context_tokens"]))
        page.locator("#cap-budget").fill(str(row["budget_gib"]))
        assert number(page.locator("#cap-per-token").inner_text()) == row["bytes_per_token_formula"]
        assert number(page.locator("#cap-per-request").inner_text()) == row["bytes_per_request"]
        assert number(page.locator("#cap-fit").inner_text()) == row["max_requests"], row
        assert page.locator("#cap-vllm").inner_text() == row["vllm_line"]
        assert page.locator("#cap-rows tr.match").count() == 1
    assert page.locator("#cap-rows td.disagree").count() == 0
    # a budget the student types: 1 GiB for requests of 1,000 tokens of the lab's model
    lab = read_csv_rows(built / "kv_capacity.csv")[0]
    page.locator("#cap-model").select_option(lab["model"])
    page.locator("#cap-dtype").select_option(lab["dtype"])
    page.locator("#cap-tokens").fill("1000")
    page.locator("#cap-budget").fill("1")
    assert number(page.locator("#cap-fit").inner_text()) == 1024**3 // (lab["bytes_per_token_formula"] * 1000)


@pytest.mark.parametrize("tokens, budget", [("0", "1"), ("-5", "1"), ("1.5", "1"), ("", "1"), ("100", "-1")])
def test_the_budget_refuses_what_is_no_count_of_tokens_or_memory(browser_page, tokens, budget):
    """0, -5, 1.5 or nothing for the tokens (or a negative memory) is said to be wrong, and nothing is
    counted from it: it was once read as 1 token."""
    page, *_ = browser_page
    page.locator("#cap-tokens").fill(tokens)
    page.locator("#cap-budget").fill(budget)
    problem = page.locator("#cap-problem")
    assert problem.is_visible() and problem.inner_text().strip()
    assert page.locator("#cap-fit").inner_text() == "–" and page.locator("#cap-per-request").inner_text() == "–"
    page.locator("#cap-tokens").fill("100")
    page.locator("#cap-budget").fill("1")
    assert not problem.is_visible() and number(page.locator("#cap-fit").inner_text()) > 0


def test_the_grid_label_follows_the_step_and_the_mode(browser_page, built):
    page, *_ = browser_page
    steps_count = load(built, "explore_steps")["new_tokens"]
    said = {}
    for mode in ("with_cache", "without_cache"):
        page.locator(f"input[name=mode][value={mode}]").check()
        for step in (1, 2, steps_count):
            page.locator("#step").fill(str(step))
            said[mode, step] = page.locator("#fed-back").inner_text()
            assert str(step - 1) in said[mode, step], said[mode, step]
    assert said["with_cache", steps_count] != said["without_cache", steps_count]


def test_no_probability_prints_a_run_of_zeros(browser_page):
    """However cold the temperature, a tiny probability reads as "under 0.01%", not 0.0000000000025%."""
    page, *_ = browser_page
    page.locator("#temperature").fill("0.1")
    shown = page.locator("ol.bars .prob").all_inner_texts()
    assert shown and not [text for text in shown if re.search(r"0[.,]000", text)], shown


def test_the_batch_table_shows_batch_tsv_s_throughput(browser_page, built):
    page, *_ = browser_page
    rows = read_csv_rows(built / "batch.tsv")
    for row in rows:
        cell = page.locator(f"#batch-table tr[data-b='{row['B']}'] td[data-mode='{row['mode']}']").inner_text()
        assert number(cell) == round(row["S_TG t/s"]), (row["mode"], row["B"], cell)
    assert page.locator("#batch-table tbody tr").count() == len({row["B"] for row in rows})


def test_the_page_says_which_characters_its_font_cannot_draw(built, tmp_path):
    """A model whose texts hold characters the embedded Hangul font lacks (a Chinese tokenizer's simplified
    ones) gets a note counting them (the tests' random model writes some of its own)."""
    results = {name: built / RESULTS[name].path.removeprefix("results/") for name in EXPLORE_READS}
    template = ROOT / EXPLORE_TEMPLATE
    render = lambda paths: page_module.render_explore(template, template.with_name("explore.js"),  # noqa: E731
                                                      template.with_name("explore.css"), paths, hangul_font_path(), "en")

    def missing(page: str) -> int:
        note = page.split('id="missing-glyphs">')[1:]
        return int(note[0].split(" characters")[0]) if note else 0

    before = missing(render(results))
    answers = json.loads(results["temp_answers"].read_text(encoding="utf-8"))
    key = next(iter(answers["answers"]))
    answers["answers"][key][0] = "你们好 가람"
    changed = tmp_path / "temp_answers.json"
    changed.write_text(json.dumps(answers, ensure_ascii=False), encoding="utf-8")
    assert missing(render({**results, "temp_answers": changed})) == before + 2  # 好 is in NanumGothic, 你 and 们 are not


def test_the_page_reads_in_english_too(built):
    """report.language en: the same page with English words (rendered here from the build's files)."""
    results = {name: built / RESULTS[name].path.removeprefix("results/") for name in EXPLORE_READS}
    template = ROOT / EXPLORE_TEMPLATE
    page = page_module.render_explore(template, template.with_name("explore.js"), template.with_name("explore.css"),
                                      results, hangul_font_path(), "en")
    assert "<h2 id=\"steps-title\">1. Step through generation</h2>" in page and '"with_cache":"with cache"' in page
    korean = page_module.render_explore(template, template.with_name("explore.js"), template.with_name("explore.css"),
                                        results, hangul_font_path(), "ko")
    assert HANGUL.search(korean.split('<h2 id="steps-title">')[1].split("</h2>")[0])
    assert (built / "explore.html").read_text(encoding="utf-8") == korean  # the build's page is this render
