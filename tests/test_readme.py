"""The README, held to what runs: its graph commands as printed, the Mermaid block and the rule-graph
picture as their commands make them, its install lines and its fixed numbers."""
import os
import re
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvlab.lab.formulas import fed_formulas

from helpers import ROOT, copy_workflow

README = (ROOT / "README.md").read_text(encoding="utf-8")
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
NO_DOT = "Graphviz's dot is not installed (apt-get install graphviz): the drawn graphs are not checked"
SVG = "{http://www.w3.org/2000/svg}"


def bash_lines(prefix: str) -> list[str]:
    """The lines of the README's ```bash blocks that start with `prefix`."""
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    return [line for block in blocks for line in block.splitlines() if line.startswith(prefix)]


def sh(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """`command` as a user's shell runs it (a failing stage of a pipe fails it)."""
    return subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=ENV, capture_output=True, text=True)


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The workflow as a fresh clone has it, nothing built."""
    return copy_workflow(tmp_path_factory.mktemp("clone") / "kvlab")


def svg_graph(path: Path) -> tuple[set[str], set[tuple[str, str]], dict[str, float]]:
    """Node labels, edges as (from, to) labels and each label's y (down the page) of a dot SVG."""
    root = ET.parse(path).getroot()
    labels, heights, edges = {}, {}, set()
    for group in root.iter(f"{SVG}g"):
        title = group.find(f"{SVG}title").text if group.find(f"{SVG}title") is not None else None
        text = group.find(f"{SVG}text")
        if group.get("class") == "node":
            labels[title] = text.text
            heights[text.text] = float(text.get("y"))
        elif group.get("class") == "edge":
            edges.add(tuple(title.split("->")))
    return set(labels.values()), {(labels[a], labels[b]) for a, b in edges}, heights


def test_dag_commands_run_as_printed(clone):
    commands = bash_lines("snakemake --dag")
    assert len(commands) >= 2 and any("results/topp.json" in command for command in commands), commands
    for command in commands:
        graph = sh(command.split("|")[0], clone)  # the Snakemake half runs everywhere
        assert graph.returncode == 0, graph.stderr[-3000:]
        assert graph.stdout.lstrip().startswith("digraph") and "topp" in graph.stdout
    if shutil.which("dot") is None:
        pytest.skip(NO_DOT)
    for command in commands:
        result = sh(command, clone)
        assert result.returncode == 0, result.stderr[-3000:]
        rules, _, _ = svg_graph(clone / command.split(">")[-1].strip())
        if "results/topp.json" in command:  # one target: it and its ancestors, nothing else
            assert rules == {"corpus", "tokenizer", "pretrain", "inspect_checkpoint", "topp"}, rules
        else:
            assert {"all", "report", "check", "topp", "pretrain"} <= rules, rules


def mermaid_graph(text: str) -> tuple[dict[str, str], set[tuple[str, str]]]:
    """Each rule's style and the edges, by rule name, of Snakemake's mermaid-js output."""
    names = dict(re.findall(r"^\s*(id\d+)\[([^\]]+)\]$", text, re.M))
    styles = {names[node]: style for node, style in re.findall(r"^\s*style (id\d+) (.+)$", text, re.M)}
    edges = {(names[a], names[b]) for a, b in re.findall(r"^\s*(id\d+) --> (id\d+)$", text, re.M)}
    return styles, edges


def test_mermaid_block_is_what_its_command_prints(clone):
    command = re.search(r"`(snakemake --rulegraph mermaid-js[^`]*)`", README).group(1)
    printed = sh(command, clone)
    assert printed.returncode == 0, printed.stderr[-3000:]
    block = re.search(r"```mermaid\n(.*?)```", README, re.S).group(1)
    # the same nodes, colours and arrows (Snakemake numbers the nodes in an order that varies run to run)
    assert mermaid_graph(block) == mermaid_graph(printed.stdout)
    assert block.splitlines()[:4] == printed.stdout.splitlines()[:4]  # the title and the layout line
    styles, _ = mermaid_graph(block)
    assert "all" not in styles and "check" not in styles and "report" in styles


def test_rulegraph_picture_is_what_its_command_draws(clone):
    """docs/rulegraph.svg holds every rule but `all` and `check`, top to bottom, and redrawing it with
    the README's command gives the same graph."""
    committed = ROOT / "docs" / "rulegraph.svg"
    assert f"]({committed.relative_to(ROOT)})" in README
    rules, edges, heights = svg_graph(committed)
    listed = sh("snakemake --list-rules", clone)
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert rules == set(listed.stdout.split()) - {"all", "check"}, "redraw docs/rulegraph.svg with the README's command"
    assert heights["corpus"] < heights["pretrain"] < heights["report"]  # top to bottom
    if shutil.which("dot") is None:
        pytest.skip(NO_DOT)
    [command] = [line for line in bash_lines("PYTHONHASHSEED=0 snakemake --rulegraph") if "docs/rulegraph.svg" in line]
    result = sh(command, clone)
    assert result.returncode == 0, result.stderr[-3000:]
    redrawn_rules, redrawn_edges, _ = svg_graph(clone / "docs" / "rulegraph.svg")
    assert (redrawn_rules, redrawn_edges) == (rules, edges)


def test_install_lines_pin_the_torch_of_pyproject():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    [torch_pin] = [d for d in dependencies if d.startswith("torch==")]
    assert set(re.findall(r"torch==[\d.]+", README)) == {torch_pin}
    cpu = [line for line in bash_lines("pip install torch") if "download.pytorch.org/whl/cpu" in line]
    assert cpu and cpu[0].startswith(f"pip install {torch_pin} --index-url") and "pip install -e ." in cpu[0]
    assert any("GPU" in line and line.startswith("pip install -e .") for line in bash_lines("pip install -e ."))


def test_fixed_numbers_agree_with_the_formulas():
    """The counts and bytes the README calls fixed by the config follow from its own P, N and shapes,
    everywhere it quotes them; and the seconds are quoted in one place only."""
    p, n = map(int, re.search(r"P = (\d+), N = (\d+) \|", README).groups())
    fed = fed_formulas(p, n)
    row = re.search(r"\| ([\d,]+) with the cache \(P\+N−1\), ([\d,]+) without .*?\*\*([\d.]+)×\*\*", README)
    assert (int(row[1].replace(",", "")), int(row[2].replace(",", ""))) == (fed["with_cache"], fed["without_cache"])
    assert row[3] == f"{fed['without_cache'] / fed['with_cache']:.1f}"
    assert f"fed_with_cache={fed['with_cache']}, P+N-1={fed['with_cache']} (P={p}, N={n})" in README
    assert f"fed_without_cache={fed['without_cache']}, P*N+N(N-1)/2={fed['without_cache']} (P={p}, N={n})" in README
    assert f"{fed_formulas(p, 256)['without_cache']:,} tokens" in README  # the sweep's longest run
    kv = re.search(r"\*\*([\d,]+)\*\* = 2 × (\d+) layers × (\d+) × (\d+) KV heads × (\d+) × (\d+) bytes, "
                   r"`k_shape` \[1, (\d+), (\d+), (\d+)\]", README)
    layers, tokens, heads, head_dim, width = map(int, kv.groups()[1:6])
    assert int(kv[1].replace(",", "")) == 2 * layers * tokens * heads * head_dim * width
    assert list(map(int, kv.groups()[6:])) == [tokens, heads, head_dim]
    assert f"measured_bytes={int(kv[1].replace(',', ''))}, formula_bytes={int(kv[1].replace(',', ''))}" in README
    costs = README.split("### What it costs")[1].split("\n## ")[0]
    assert not re.search(r"\d+(\.\d+)? s\b", costs), "job times belong in 'Measured here' only"
