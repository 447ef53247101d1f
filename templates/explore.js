/* results/explore.html's script (kvlab.present.explore): every panel drawn from the JSON document the page
   carries (#explore-data), in the page's language. No request: nothing is fetched, everything is computed here. */
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("explore-data").textContent);
  const lang = data.lang;
  const labels = data.labels;
  const SVG = "http://www.w3.org/2000/svg";
  const MODES = ["with_cache", "without_cache"];
  const COLORS = { with_cache: "#1f77b4", without_cache: "#d62728" };

  // --- words and numbers ------------------------------------------------------------------------
  function fill(text, values) {
    return text.replace(/\{(\w+)\}/g, (whole, name) => (name in values ? String(values[name]) : whole));
  }
  function say(key, values) { return fill(labels[key], values || {}); }
  // a label as nodes, each {name} filled with the node or text of `values`: a number the page shows stays one element
  function compose(key, values) {
    const fragment = document.createDocumentFragment();
    labels[key].split(/(\{\w+\})/).forEach(part => {
      const name = /^\{(\w+)\}$/.test(part) ? part.slice(1, -1) : null;
      const value = name !== null && name in values ? values[name] : part;
      fragment.appendChild(value instanceof Node ? value : document.createTextNode(String(value)));
    });
    return fragment;
  }
  const integerFormat = new Intl.NumberFormat(lang, { maximumFractionDigits: 0 });
  function integer(n) { return integerFormat.format(n); }
  function decimal(x, digits) {
    return new Intl.NumberFormat(lang, { minimumFractionDigits: digits, maximumFractionDigits: digits }).format(x);
  }
  function percent(share, digits) {
    return new Intl.NumberFormat(lang, { style: "percent", minimumFractionDigits: digits, maximumFractionDigits: digits }).format(share);
  }
  const smallShare = new Intl.NumberFormat(lang, { style: "percent", maximumSignificantDigits: 2 });
  // a share as a person reads it: one decimal from 1%, two significant digits down to 0.01%, "under 0.01%" below
  function probability(share) {
    if (share >= 0.01) return percent(share, 1);
    return share >= 0.0001 ? smallShare.format(share) : say("below_share", { share: percent(0.0001, 2) });
  }
  const UNITS = ["KiB", "MiB", "GiB", "TiB"];
  function bytes(n) {
    let value = n, unit = -1;
    while (value >= 1024 && unit < UNITS.length - 1) { value /= 1024; unit += 1; }
    return unit < 0 ? integer(n) + " B" : integer(n) + " B (" + decimal(value, 1) + " " + UNITS[unit] + ")";
  }
  function element(tag, attributes, text) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function verdict(node, same) {  // two numbers that must be equal: say whether they are
    node.textContent = same ? say("equal") : say("differ");
    node.className = same ? "agree" : "disagree";
  }

  // a round spacing (1, 2, 2.5 or 5 times a power of ten) for about `count` ticks up to `max`
  function niceStep(max, count) {
    const raw = max / count, power = 10 ** Math.floor(Math.log10(raw)), factor = raw / power;
    return (factor <= 1 ? 1 : factor <= 2 ? 2 : factor <= 2.5 ? 2.5 : factor <= 5 ? 5 : 10) * power;
  }

  // --- a small line chart in SVG ----------------------------------------------------------------
  // series: [{values: [y per x], color, label}], x from 1 to values.length; marker: the x to mark.
  function lineChart(svg, series, marker, xLabel, yLabel) {
    while (svg.lastChild && svg.lastChild.tagName !== "title") svg.removeChild(svg.lastChild);
    const width = Number(svg.getAttribute("width")), height = Number(svg.getAttribute("height"));
    const left = 78, right = 12, top = 12, bottom = 40;
    const count = Math.max(...series.map(s => s.values.length));
    const ys = series.flatMap(s => s.values.filter(v => v !== null));
    const tick = niceStep(Math.max(...ys, 1e-12), 4);
    const yMax = Math.ceil(Math.max(...ys, 1e-12) / tick) * tick;
    const x = i => left + (count > 1 ? (i - 1) / (count - 1) : 0) * (width - left - right);
    const y = v => top + (1 - v / yMax) * (height - top - bottom);
    const add = (tag, attributes, text) => {
      const node = document.createElementNS(SVG, tag);
      for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
      if (text !== undefined) node.textContent = text;
      svg.appendChild(node);
      return node;
    };
    for (let k = 0; k * tick <= yMax * (1 + 1e-9); k++) {
      const value = k * tick;
      add("line", { x1: left, x2: width - right, y1: y(value), y2: y(value), class: "grid-line" });
      add("text", { x: left - 6, y: y(value) + 4, "text-anchor": "end" }, tick >= 1 ? integer(value) : decimal(value, 2));
    }
    add("line", { x1: left, x2: width - right, y1: y(0), y2: y(0), class: "axis" });
    add("line", { x1: left, x2: left, y1: top, y2: y(0), class: "axis" });
    for (const tick of [1, Math.round(count / 2), count]) {
      add("text", { x: x(tick), y: y(0) + 15, "text-anchor": "middle" }, integer(tick));
    }
    add("text", { x: (left + width - right) / 2, y: height - 6, "text-anchor": "middle" }, xLabel);
    add("text", { x: 12, y: top + (height - top - bottom) / 2, "text-anchor": "middle",
                  transform: `rotate(-90 12 ${top + (height - top - bottom) / 2})` }, yLabel);
    series.forEach((s, index) => {
      const points = s.values.map((v, i) => (v === null ? null : `${x(i + 1)},${y(v)}`)).filter(p => p !== null);
      add("polyline", { points: points.join(" "), fill: "none", stroke: s.color, "stroke-width": 2 });
      const at = s.values[marker - 1];
      if (at !== null && at !== undefined) add("circle", { cx: x(marker), cy: y(at), r: 4, fill: s.color });
      add("text", { x: left + 8, y: top + 14 + 15 * index, fill: s.color, style: `fill:${s.color}` }, s.label);
    });
  }

  // ==============================================================================================
  // Panel 1: step through generation
  // ==============================================================================================
  const gen = data.generation;
  const steps = gen.steps;
  const model = gen.model;
  const positions = gen.prompt_len + gen.new_tokens - 1;  // the last new token is never fed back
  const stepInput = document.getElementById("step");
  const gridRows = document.getElementById("grid-rows");
  const cells = [];  // cells[layer][position]

  // text with the tokenizer's special tokens (<|im_start|>, <|im_end|>) set apart, in a monospace font
  function withSpecialTokens(text) {
    const fragment = document.createDocumentFragment();
    text.split(/(<\|[^|<>]*\|>)/).forEach((part, index) => {
      if (part) fragment.appendChild(index % 2 ? element("code", { class: "special" }, part) : document.createTextNode(part));
    });
    return fragment;
  }

  function cumulative(values) {
    let total = 0;
    return values.map(v => (v === null ? null : (total += v)));
  }
  const fedSoFar = {}, timeSoFar = {};
  for (const mode of MODES) {
    fedSoFar[mode] = cumulative(steps.map(s => s[mode].fed));
    let untimed = false;
    timeSoFar[mode] = cumulative(steps.map(s => {
      untimed = untimed || s[mode].time_s === null;
      return untimed ? null : s[mode].time_s * 1000;
    }));
  }

  function buildGrid() {
    const axis = element("div", { class: "axis-row" });
    axis.appendChild(element("span", { class: "name" }));
    const span = element("div", { class: "span" });
    span.style.gridTemplateColumns = `${gen.prompt_len}fr ${positions - gen.prompt_len}fr`;
    span.appendChild(element("div", { class: "prompt-span" }, `${labels.prompt} (P = ${integer(gen.prompt_len)})`));
    span.appendChild(element("div", { class: "new-span", id: "fed-back" }));  // drawStep says it, by step and mode
    axis.appendChild(span);
    for (let layer = 0; layer < model.layers; layer++) {
      const row = element("div", { class: "layer" });
      row.appendChild(element("span", { class: "name" }, `${labels.layer} ${layer + 1}`));
      const strip = element("div", { class: "cells", "data-layer": String(layer) });
      strip.style.gridTemplateColumns = `repeat(${positions}, 1fr)`;
      cells.push([]);
      for (let position = 0; position < positions; position++) {
        const cell = element("div", { class: "cell" });
        strip.appendChild(cell);
        cells[layer].push(cell);
      }
      row.appendChild(strip);
      gridRows.appendChild(row);
    }
    gridRows.appendChild(axis);
  }

  // The kind of every cell of `layer` at step `index` (0-based) in `mode`, from what was measured: the K/V
  // rows the layer computed at the step, the tokens its cache held after it, and the rows of the step before.
  function cellKinds(index, mode, layer) {
    const now = steps[index][mode];
    const computed = now.kv_computed[layer];
    const kinds = new Array(positions).fill("");
    if (mode === "with_cache") {
      const end = now.cache_tokens[layer];
      for (let p = 0; p < end; p++) kinds[p] = p < end - computed ? "cached" : "new";
    } else {
      const before = index > 0 ? steps[index - 1][mode].kv_computed[layer] : 0;
      for (let p = 0; p < computed; p++) kinds[p] = p < before ? "again" : "new";
    }
    return kinds;
  }

  function drawStep() {
    const index = Number(stepInput.value) - 1;
    const step = steps[index];
    const mode = document.querySelector("input[name=mode]:checked").value;
    document.getElementById("step-label").textContent = say("step_of", { step: index + 1, steps: steps.length });
    // the text: the prompt's end, what the earlier steps produced, and this step's token
    const prompt = gen.prompt_text;
    document.getElementById("prompt-tail").replaceChildren(withSpecialTokens("…" + prompt.slice(Math.max(0, prompt.length - 90))));
    const generated = document.getElementById("generated");
    generated.replaceChildren(withSpecialTokens(steps.slice(0, index).map(s => s.piece).join("")));
    const token = step.piece === "" ? say("piece", { id: step.id }) : step.piece;
    const produced = element("span", { class: "produced", title: say("new_token", { token: token, id: step.id }) });
    produced.appendChild(withSpecialTokens(token));
    generated.appendChild(produced);
    // the grid: the new tokens fed back before this step, and how this step feeds them
    document.getElementById("fed-back").textContent =
      say(mode === "with_cache" ? "fed_back" : "fed_back_again", { count: integer(index) });
    for (let layer = 0; layer < model.layers; layer++) {
      const kinds = cellKinds(index, mode, layer);
      kinds.forEach((kind, position) => { cells[layer][position].className = kind ? "cell " + kind : "cell"; });
    }
    const now = step[mode];
    const fed = now.kv_computed[0];
    let caption = say("grid_caption", { mode: labels[mode], step: index + 1, fed: integer(fed), layers: model.layers,
                                         vectors: integer(fed * model.layers) });
    caption += "; " + (mode === "with_cache" ? say("grid_cached", { cached: integer(now.cache_tokens[0] - fed) })
                                             : say("grid_nothing_kept"));
    document.getElementById("grid-caption").textContent = caption + ".";
    // the numbers of both modes
    for (const m of MODES) {
      const s = step[m];
      document.getElementById("fed-" + m).textContent = integer(s.fed);
      document.getElementById("total-" + m).textContent = integer(fedSoFar[m][index]);
      document.getElementById("formula-" + m).textContent = integer(s.formula_so_far);
      document.getElementById("held-" + m).textContent = integer(s.cache_tokens[0]);
      document.getElementById("bytes-" + m).textContent = bytes(s.cache_bytes);
      document.getElementById("bytes-formula-" + m).textContent = bytes(cacheFormula(s.cache_tokens[0]));
      document.getElementById("time-" + m).textContent =
        s.time_s === null ? say("not_timed", { timed: gen.timed_steps }) : decimal(s.time_s * 1000, 2);
      const total = timeSoFar[m][index];
      document.getElementById("time-total-" + m).textContent = total === null ? "–" : decimal(total, 2);
    }
    const number = index + 1;
    const held = step.with_cache.cache_tokens[0];
    document.getElementById("formula-note").replaceChildren(
      element("li", {}, say("formula_with", { prompt_len: gen.prompt_len, previous: number - 1 }) + " = " +
                        integer(step.with_cache.formula_so_far)),
      element("li", {}, say("formula_without", { prompt_len: gen.prompt_len, step: number, previous: number - 1 }) + " = " +
                        integer(step.without_cache.formula_so_far)),
      element("li", {}, say("bytes_formula", { layers: model.layers, tokens: integer(held), kv_heads: model.kv_heads,
                                               head_dim: model.head_dim, bytes: model.bytes_per_element }) + " = " +
                        integer(cacheFormula(held))));
    lineChart(document.getElementById("fed-chart"),
              MODES.map(m => ({ values: fedSoFar[m], color: COLORS[m], label: labels[m] })), number,
              labels.step_axis, labels.fed_axis);
    lineChart(document.getElementById("time-chart"),
              MODES.map(m => ({ values: timeSoFar[m], color: COLORS[m], label: labels[m] })), number,
              labels.step_axis, labels.time_axis);
  }

  // 2 x layers x tokens x KV heads x head_dim x bytes per element: the lab's formula (step 4)
  function cacheFormula(tokens) {
    return 2 * model.layers * tokens * model.kv_heads * model.head_dim * model.bytes_per_element;
  }

  function drawChecks() {
    // after the last step, the totals are step 2's (count.json)
    const last = steps.length - 1;
    const count = gen.count;
    const check = document.getElementById("count-check");
    check.replaceChildren(document.createTextNode(
      `count.json: fed_with_cache ${integer(count.fed_with_cache)}, fed_without_cache ${integer(count.fed_without_cache)}; ` +
      say("totals_after", { step: steps.length }) + ": "));
    check.appendChild(element("output", { id: "count-page-with_cache" }, integer(fedSoFar.with_cache[last])));
    check.appendChild(document.createTextNode(", "));
    check.appendChild(element("output", { id: "count-page-without_cache" }, integer(fedSoFar.without_cache[last])));
    check.appendChild(document.createTextNode(" — "));
    verdict(check.appendChild(element("span")), count.fed_with_cache === fedSoFar.with_cache[last] &&
            count.fed_without_cache === fedSoFar.without_cache[last]);
    // step 4's cache after its random tokens, against the formula this page computes
    const kv = gen.kvbytes;
    const node = document.getElementById("kvbytes-check");
    node.replaceChildren(document.createTextNode(`kvbytes.json: tokens ${integer(kv.tokens)}, measured_bytes ` +
      `${integer(kv.measured_bytes)}; ` + say("bytes_formula", { layers: model.layers, tokens: integer(kv.tokens),
      kv_heads: model.kv_heads, head_dim: model.head_dim, bytes: model.bytes_per_element }) + " = "));
    node.appendChild(element("output", { id: "kvbytes-page" }, integer(cacheFormula(kv.tokens))));
    node.appendChild(document.createTextNode(" — "));
    verdict(node.appendChild(element("span")), cacheFormula(kv.tokens) === kv.measured_bytes);
  }

  function moveStep(by) {
    stepInput.value = String(Math.min(steps.length, Math.max(1, Number(stepInput.value) + by)));
    drawStep();
  }

  // ==============================================================================================
  // Panel 2: temperature and top-p
  // ==============================================================================================
  const sampling = data.sampling;
  const temperatureInput = document.getElementById("temperature");
  const toppInput = document.getElementById("top-p");
  const PREFIXES = ["flat", "sharp"];
  // each prefix's candidates, most probable first (ties in the order of their ids): a temperature never reorders them
  const order = {};
  for (const key of PREFIXES) {
    const logits = sampling[key].logits;
    order[key] = logits.map((_, id) => id).sort((a, b) => logits[b] - logits[a] || a - b);
  }

  // softmax(logits / T), in the order of `ids`
  function probabilities(logits, ids, temperature) {
    const top = logits[ids[0]] / temperature;
    const weights = ids.map(id => Math.exp(logits[id] / temperature - top));
    const total = weights.reduce((sum, w) => sum + w, 0);
    return weights.map(w => w / total);
  }

  // MiniMind's top-p rule (kvlab.engine.sampling.top_p_keep) on probabilities sorted most probable first:
  // cut a candidate when the cumulative sum *before* it already exceeds p (the mask "cumsum > p" shifted right
  // by one slot), so the one that crosses p stays, and the first always stays. At p >= 1 generate skips it.
  function topPKeep(sortedProbabilities, p) {
    const keep = new Array(sortedProbabilities.length);
    let before = 0;
    for (let rank = 0; rank < sortedProbabilities.length; rank++) {
      keep[rank] = p >= 1 || rank === 0 || !(before > p);
      before += sortedProbabilities[rank];
    }
    return keep;
  }
  function keptCount(keep) { return keep.filter(Boolean).length; }

  function survivors(key, temperature, p) {
    const probs = probabilities(sampling[key].logits, order[key], temperature);
    return { probs: probs, keep: topPKeep(probs, p) };
  }

  function drawPrefix(key, temperature, p) {
    const { probs, keep } = survivors(key, temperature, p);
    const kept = keptCount(keep);
    const vocab = probs.length;
    document.getElementById("kept-" + key).replaceChildren(compose("kept_of", {
      kept: element("output", { class: "kept-count" }, integer(kept)), vocab: integer(vocab) }));
    const mass = probs.reduce((sum, prob, rank) => sum + (keep[rank] ? prob : 0), 0);
    document.getElementById("mass-" + key).textContent = say("kept_mass", { mass: percent(mass, 1) });
    // the labelled candidates as bars, scaled to the most probable one
    const list = document.getElementById("bars-" + key);
    list.replaceChildren();
    const labelled = sampling[key].labels;
    const drawn = order[key].slice(0, Object.keys(labelled).length);
    drawn.forEach((id, rank) => {
      const text = labelled[String(id)];
      const item = element("li", { class: keep[rank] ? "" : "cut" });
      if (keep[rank] && rank === kept - 1 && kept < vocab) item.classList.add("crossing");
      item.appendChild(element("span", { class: "rank" }, integer(rank + 1)));
      item.appendChild(element("span", { class: "label", title: `id ${id}` }, text === null ? say("piece", { id: id }) : text));
      const bar = element("span", { class: "bar" });
      bar.style.width = `${(100 * probs[rank] / probs[0]).toFixed(2)}%`;
      item.appendChild(element("span", {})).appendChild(bar);
      item.appendChild(element("span", { class: "prob" }, probability(probs[rank])));
      list.appendChild(item);
    });
    document.getElementById("bars-more-" + key).textContent =
      (vocab > drawn.length ? say("bars_more", { more: integer(vocab - drawn.length) }) + " " : "") + say("cut_note");
    drawCumulative(document.getElementById("curve-" + key), probs, kept, p);
  }

  // The cumulative probability against the rank (log scale), p, and where the rule cuts.
  function drawCumulative(svg, probs, kept, p) {
    while (svg.lastChild && svg.lastChild.tagName !== "title") svg.removeChild(svg.lastChild);
    const width = Number(svg.getAttribute("width")), height = Number(svg.getAttribute("height"));
    const left = 52, right = 12, top = 10, bottom = 38;
    const n = probs.length;
    const x = rank => left + Math.log(rank) / Math.log(n) * (width - left - right);  // rank from 1
    const y = v => top + (1 - v) * (height - top - bottom);
    const add = (tag, attributes, text) => {
      const node = document.createElementNS(SVG, tag);
      for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
      if (text !== undefined) node.textContent = text;
      svg.appendChild(node);
      return node;
    };
    add("rect", { x: left, y: top, width: Math.max(0, x(Math.max(kept, 1)) - left), height: height - top - bottom,
                  fill: "#1f77b4", "fill-opacity": 0.08 });
    for (const v of [0, 0.5, 1]) {
      add("line", { x1: left, x2: width - right, y1: y(v), y2: y(v), class: "grid-line" });
      add("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end" }, decimal(v, 1));
    }
    for (let tick = 1; tick <= n; tick *= 10) add("text", { x: x(tick), y: y(0) + 15, "text-anchor": "middle" }, integer(tick));
    add("line", { x1: left, x2: width - right, y1: y(0), y2: y(0), class: "axis" });
    add("line", { x1: left, x2: left, y1: top, y2: y(0), class: "axis" });
    let total = 0;
    const points = [];
    probs.forEach((prob, rank) => { total += prob; points.push(`${x(rank + 1).toFixed(1)},${y(total).toFixed(1)}`); });
    add("polyline", { points: points.join(" "), fill: "none", stroke: "#1f77b4", "stroke-width": 2 });
    add("line", { x1: left, x2: width - right, y1: y(Math.min(p, 1)), y2: y(Math.min(p, 1)), stroke: "#d62728",
                  "stroke-dasharray": "4 3" });
    add("text", { x: width - right - 4, y: y(Math.min(p, 1)) - 4, "text-anchor": "end", style: "fill:#d62728" }, `p = ${decimal(p, 2)}`);
    add("line", { x1: x(Math.max(kept, 1)), x2: x(Math.max(kept, 1)), y1: top, y2: y(0), stroke: "#1f77b4" });
    add("text", { x: x(Math.max(kept, 1)) + 4, y: y(0.25), style: "fill:#1f77b4" }, integer(kept));
    add("text", { x: (left + width - right) / 2, y: height - 6, "text-anchor": "middle" }, labels.rank_axis);
    const middle = top + (height - top - bottom) / 2;
    add("text", { x: 14, y: middle, "text-anchor": "middle", transform: `rotate(-90 14 ${middle})` }, labels.cumulative_axis);
  }

  function drawSampling() {
    const temperature = Number(temperatureInput.value), p = Number(toppInput.value);
    document.getElementById("temperature-value").textContent = decimal(temperature, 2);
    document.getElementById("top-p-value").textContent = decimal(p, 2);
    for (const key of PREFIXES) drawPrefix(key, temperature, p);
  }

  // the page's counts at T = 1 against topp.json, topp_sharp.json and the curve, at the sheet's p and the curve's
  function drawToppCheck() {
    const body = document.querySelector("#topp-check tbody");
    const curve = new Map(sampling.curve.map(row => [Number(row.p), row]));
    const buttons = document.getElementById("sheet-buttons");
    for (const [key, flatLab] of Object.entries(sampling.flat.lab)) {  // the sheet's p values, as topp.json writes them
      const p = Number(key);
      const row = element("tr", { "data-p": key });
      row.appendChild(element("td", { class: "number" }, key));
      for (const prefix of PREFIXES) {
        const page = keptCount(survivors(prefix, 1, p).keep);
        const lab = prefix === "flat" ? flatLab : sampling.sharp.lab[key];
        const onCurve = curve.has(p) ? curve.get(p)[prefix] : null;
        const cell = element("td", { class: "number" }, integer(page));
        cell.classList.add(page === lab && (onCurve === null || onCurve === page) ? "agree" : "disagree");
        row.appendChild(cell);
        row.appendChild(element("td", { class: "number" }, integer(lab)));
        row.appendChild(element("td", { class: "number" }, onCurve === null ? "–" : integer(onCurve)));
      }
      body.appendChild(row);
      const button = element("button", { type: "button", class: "choice", "data-p": key }, `p = ${key}, T = 1`);
      button.addEventListener("click", () => { toppInput.value = key; temperatureInput.value = "1"; drawSampling(); });
      buttons.appendChild(button);
      buttons.appendChild(document.createTextNode(" "));
    }
  }

  function drawAnswers() {
    const box = document.getElementById("answers");
    for (const entry of sampling.answers) {
      const column = element("div", { "data-temperature": entry.temperature });
      const heading = element("h4", {}, `T = ${entry.temperature}: `);
      heading.appendChild(compose("distinct_of", { distinct: element("output", { class: "distinct" }, integer(entry.groups.length)),
                                                   samples: integer(entry.samples) }));
      heading.appendChild(document.createTextNode(` (temp.json: ${integer(entry.distinct)}) `));
      verdict(heading.appendChild(element("span")), entry.groups.length === entry.distinct);
      column.appendChild(heading);
      const list = element("ol");
      for (const group of entry.groups) {
        const item = element("li");
        item.appendChild(element("span", { class: "times" }, `× ${integer(group.count)}`));
        item.appendChild(document.createTextNode(group.text === "" ? say("empty_answer") : group.text));
        list.appendChild(item);
      }
      column.appendChild(list);
      box.appendChild(column);
    }
  }

  // ==============================================================================================
  // Panel 3: many users at once
  // ==============================================================================================
  const capacity = data.serving.capacity;
  const GIB = 1024 ** 3;
  const modelSelect = document.getElementById("cap-model");
  const dtypeSelect = document.getElementById("cap-dtype");
  const tokensInput = document.getElementById("cap-tokens");
  const budgetInput = document.getElementById("cap-budget");
  const english = new Intl.NumberFormat("en");  // vLLM's log line is English

  function capacityRows() {
    return capacity.filter(row => row.model === modelSelect.value && row.dtype === dtypeSelect.value);
  }
  // requests whose whole cache fits: floor(budget bytes / bytes per request), as kvlab.measure.capacity counts them
  function requestsThatFit(budgetGib, perToken, tokens) {
    const budgetBytes = Math.floor(budgetGib * GIB);
    return { budgetBytes: budgetBytes, fit: Math.floor(budgetBytes / (perToken * tokens)),
             concurrency: budgetBytes / (perToken * tokens), cacheTokens: Math.floor(budgetBytes / perToken) };
  }

  function fillDtypes() {
    const kept = dtypeSelect.value;
    const dtypes = [...new Set(capacity.filter(row => row.model === modelSelect.value).map(row => row.dtype))];
    dtypeSelect.replaceChildren(...dtypes.map(d => element("option", { value: d }, d)));
    if (dtypes.includes(kept)) dtypeSelect.value = kept;
  }

  function drawCapacity() {
    const rows = capacityRows();
    if (!rows.length) return;
    const first = rows[0];
    const perToken = first.bytes_per_token_formula;
    // what the student typed, refused when it is no count of tokens or no amount of memory (never read as 1 or 0)
    const tokens = Number(tokensInput.value), budget = Number(budgetInput.value);
    const badTokens = tokensInput.value.trim() === "" || !Number.isInteger(tokens) || tokens < 1;
    const badBudget = budgetInput.value.trim() === "" || !Number.isFinite(budget) || budget < 0;
    tokensInput.setAttribute("aria-invalid", String(badTokens));
    budgetInput.setAttribute("aria-invalid", String(badBudget));
    const problem = document.getElementById("cap-problem");
    problem.textContent = [badTokens ? say("cap_invalid_tokens") : "", badBudget ? say("cap_invalid_budget") : ""]
      .filter(Boolean).join(" ");
    problem.hidden = !(badTokens || badBudget);
    if (badTokens || badBudget) {
      for (const id of ["cap-per-request", "cap-per-request-formula", "cap-fit", "cap-fit-formula", "cap-vllm"]) {
        document.getElementById(id).textContent = "–";
      }
      return;
    }
    const counted = requestsThatFit(budget, perToken, tokens);
    document.getElementById("cap-per-token").textContent = bytes(perToken);
    // int8 keeps a float32 scale per token and KV head beside its head_dim bytes
    document.getElementById("cap-per-token-formula").textContent = first.scale_bytes
      ? `2 × ${first.layers} × ${first.kv_heads} × (${first.head_dim} × ${first.bytes_per_element} + ${first.scale_bytes})`
      : `2 × ${first.layers} × ${first.kv_heads} × ${first.head_dim} × ${first.bytes_per_element}`;
    document.getElementById("cap-per-request").textContent = bytes(perToken * tokens);
    document.getElementById("cap-per-request-formula").textContent = `${integer(perToken)} × ${integer(tokens)}`;
    document.getElementById("cap-fit").textContent = integer(counted.fit);
    document.getElementById("cap-fit-formula").textContent =
      `⌊${integer(counted.budgetBytes)} / ${integer(perToken * tokens)}⌋`;
    document.getElementById("cap-vllm").textContent =
      `KV cache size: ${english.format(counted.cacheTokens)} tokens, Maximum concurrency for ` +
      `${english.format(tokens)} tokens per request: ${counted.concurrency.toFixed(2)}x`;
    const body = document.querySelector("#cap-rows tbody");
    body.replaceChildren();
    for (const row of rows) {
      const page = requestsThatFit(row.budget_gib, perToken, row.context_tokens).fit;
      const line = element("tr", { class: row.budget_gib === budget && row.context_tokens === tokens ? "match" : "" });
      line.appendChild(element("td", { class: "number" }, String(row.budget_gib)));
      line.appendChild(element("td", { class: "number" }, integer(row.context_tokens)));
      line.appendChild(element("td", { class: "number" }, integer(row.max_requests)));
      const cell = line.appendChild(element("td", { class: "number" }, integer(page)));
      cell.classList.add(page === row.max_requests ? "agree" : "disagree");
      body.appendChild(line);
    }
    drawBatch(counted.budgetBytes);
  }

  function drawBatch(budgetBytes) {
    const byB = new Map();
    for (const row of data.serving.batch) {
      if (!byB.has(row.B)) byB.set(row.B, {});
      byB.get(row.B)[row.mode] = row;
    }
    const fastest = Math.max(...data.serving.batch.map(row => row["S_TG t/s"]));
    const body = document.querySelector("#batch-table tbody");
    body.replaceChildren();
    for (const [b, modes] of [...byB.entries()].sort((one, two) => one[0] - two[0])) {
      const line = element("tr", { "data-b": String(b) });
      line.appendChild(element("td", { class: "number" }, integer(b)));
      for (const mode of ["shared", "distinct"]) {
        const row = modes[mode];
        line.appendChild(element("td", { class: "number", "data-mode": mode },
          row ? `${integer(row["S_TG t/s"])} [${integer(row.S_TG_low)}–${integer(row.S_TG_high)}]` : "–"));
        const cell = element("td", { class: "bar-cell" });
        if (row) {
          const bar = element("div", { class: mode === "shared" ? "hbar" : "hbar distinct" });
          bar.style.width = `${(100 * row["S_TG t/s"] / fastest).toFixed(1)}%`;
          cell.appendChild(bar);
        }
        line.appendChild(cell);
      }
      const held = (modes.distinct || modes.shared).kv_bytes_measured;
      line.appendChild(element("td", { class: "number" }, bytes(held)));
      line.appendChild(element("td", {}, held <= budgetBytes ? say("in_budget") : say("over_budget")));
      body.appendChild(line);
    }
  }

  // ==============================================================================================
  // Wiring: every control redraws what it drives
  // ==============================================================================================
  buildGrid();
  document.getElementById("prompt-full").textContent = gen.prompt_text;
  stepInput.addEventListener("input", drawStep);
  document.getElementById("step-prev").addEventListener("click", () => moveStep(-1));
  document.getElementById("step-next").addEventListener("click", () => moveStep(1));
  for (const radio of document.querySelectorAll("input[name=mode]")) radio.addEventListener("change", drawStep);
  drawChecks();
  drawStep();

  temperatureInput.addEventListener("input", drawSampling);
  toppInput.addEventListener("input", drawSampling);
  drawToppCheck();
  drawAnswers();
  drawSampling();

  const models = [...new Set(capacity.map(row => row.model))];
  modelSelect.replaceChildren(...models.map(m => element("option", { value: m }, m)));
  fillDtypes();
  if (capacity.length) {
    tokensInput.value = String(gen.prompt_len + gen.new_tokens);
    budgetInput.value = String(capacity[0].budget_gib);
  }
  modelSelect.addEventListener("change", () => { fillDtypes(); drawCapacity(); });
  dtypeSelect.addEventListener("change", drawCapacity);
  tokensInput.addEventListener("input", drawCapacity);
  budgetInput.addEventListener("input", drawCapacity);
  drawCapacity();
  document.body.setAttribute("data-ready", "true");
})();
