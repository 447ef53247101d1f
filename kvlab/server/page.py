"""The page at GET /: a prompt box with temperature, top-p and max tokens, the answer streaming in as
the engine draws it (the chat endpoint, read as server-sent events by fetch), and the engine's live
state polled from GET /state: requests running and waiting, the pool's blocks in use, recent steps.
One self-contained page, no script from elsewhere; its Hangul font, the whole NanumGothic face the
figures use, comes from this server (kvlab.present.fonts.FONT_ROUTE), as answers are not known in advance."""

from __future__ import annotations

import html as html_escape
import json

from kvlab.present.fonts import FONT_ROUTE, font_family, served_font_face

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>kvlab serve: {model}</title>
<style>
  /* the Hangul font, served by this server (GET {font_route}): the answers read on a machine without a Korean font */
  {font_face}
  body {{ font-family: {font_family}; margin: 2em auto; max-width: 60em; color: #222; }}
  textarea, input, button {{ font-family: inherit; }}
  textarea {{ width: 100%; height: 5em; font-size: 1em; }}
  label {{ margin-right: 1.5em; }}
  input[type=number] {{ width: 5em; }}
  #answer {{ white-space: pre-wrap; border: 1px solid #ccc; min-height: 4em; padding: 0.5em; margin: 1em 0; }}
  #blocks {{ display: flex; flex-wrap: wrap; gap: 2px; margin: 0.5em 0; }}
  #blocks span {{ width: 10px; height: 10px; background: #ddd; }}
  #blocks span.used {{ background: #1f77b4; }}
  table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; }}
  .numbers span {{ margin-right: 1.5em; }}
</style>
</head>
<body>
<h1>kvlab serve <small>{model}</small></h1>
<form id="ask">
  <textarea id="prompt" placeholder="Ask something">가람 마을의 특산물은 무엇인가요?</textarea><br>
  <label>temperature <input id="temperature" type="number" min="0" step="any" value="0.85"></label>
  <label>top-p <input id="top_p" type="number" min="0.01" max="1" step="any" value="0.85"></label>
  <label>max tokens <input id="max_tokens" type="number" min="1" value="64"></label>
  <button id="send" type="submit">Send</button>
</form>
<div id="answer"></div>
<div id="usage"></div>
<h2>The engine</h2>
<div class="numbers">
  <span>running <b id="running">0</b></span><span>waiting <b id="waiting">0</b></span>
  <span>blocks used <b id="blocks_used">0</b> of <b id="num_blocks">0</b></span>
  <span>steps <b id="steps">0</b></span><span>preemptions <b id="preemptions">0</b></span>
  <span>policy <b id="policy"></b></span>
</div>
<div id="blocks"></div>
<table><thead><tr><th>request</th><th>state</th><th>prompt</th><th>new / max</th><th>n</th><th>blocks</th></tr></thead>
<tbody id="requests"></tbody></table>
<script>
const $ = (id) => document.getElementById(id);
async function ask(event) {{
  event.preventDefault();
  $("answer").textContent = ""; $("usage").textContent = "";
  const body = {{model: {model_json}, stream: true,
    messages: [{{role: "user", content: $("prompt").value}}],
    temperature: parseFloat($("temperature").value), top_p: parseFloat($("top_p").value),
    max_tokens: parseInt($("max_tokens").value)}};
  const response = await fetch("/v1/chat/completions", {{method: "POST",
    headers: {{"Content-Type": "application/json"}}, body: JSON.stringify(body)}});
  if (!response.ok) {{ $("answer").textContent = (await response.json()).error.message; return; }}
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = "";
  for (;;) {{
    const {{value, done}} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {{stream: true}});
    let end;
    while ((end = buffer.indexOf("\\n\\n")) >= 0) {{
      const line = buffer.slice(0, end); buffer = buffer.slice(end + 2);
      if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
      const chunk = JSON.parse(line.slice(6));
      if (chunk.usage) $("usage").textContent = `prompt ${{chunk.usage.prompt_tokens}} tokens, answer ${{chunk.usage.completion_tokens}}`;
      for (const choice of chunk.choices || []) {{
        if (choice.delta && choice.delta.content) $("answer").textContent += choice.delta.content;
        if (choice.finish_reason) $("answer").dataset.finish = choice.finish_reason;
      }}
    }}
  }}
}}
async function poll() {{
  try {{
    const state = await (await fetch("/state")).json();
    for (const key of ["running", "waiting", "blocks_used", "num_blocks", "steps", "preemptions", "policy"])
      $(key).textContent = state[key];
    const blocks = $("blocks");
    if (blocks.children.length !== state.num_blocks) {{
      blocks.innerHTML = "";
      for (let i = 0; i < state.num_blocks; i++) blocks.appendChild(document.createElement("span"));
    }}
    [...blocks.children].forEach((cell, i) => cell.className = i < state.blocks_used ? "used" : "");
    $("requests").innerHTML = state.requests.map((r) =>
      `<tr><td>${{r.id}}</td><td>${{r.state}}</td><td>${{r.prompt_tokens}}</td><td>${{r.new_tokens}} / ${{r.max_tokens}}</td>` +
      `<td>${{r.n}}</td><td>${{r.blocks}}</td></tr>`).join("");
  }} catch (err) {{}}
  setTimeout(poll, 300);
}}
$("ask").addEventListener("submit", ask);
poll();
</script>
</body>
</html>
"""


def html(model_name: str) -> str:
    """The page for the served model (its name escaped for HTML, and for the script as a JSON string)."""
    return PAGE.format(model=html_escape.escape(model_name), model_json=json.dumps(model_name).replace("<", "\\u003c"),
                       font_face=served_font_face(), font_family=font_family(), font_route=FONT_ROUTE)
