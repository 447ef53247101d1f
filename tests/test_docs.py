"""The README and docs/, held to what runs: the README a front page of at most 200 lines whose links
resolve, every `snakemake` command printed there runs as printed (as a dry run; the graph commands
draw), the rule-graph picture is what its command draws, the configuration page is what its
generator writes from the schema, the install line pins pyproject's torch, the numbers quoted
as fixed by the config agree with the formulas, the layout lists name the tree's modules and files,
and the pages say how things are (the trail of work in docs/log/)."""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvlab.cluster import plugin_installed
from kvlab.facts.formulas import fed_formulas

from helpers import ROOT, copy_workflow

README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = {path.name: path.read_text(encoding="utf-8") for path in sorted((ROOT / "docs").glob("*.md"))}
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
NO_DOT = "Graphviz's dot is not installed (apt-get install graphviz): the drawn graphs are not checked"
SVG = "{http://www.w3.org/2000/svg}"
# Paths on a user's own machine, which a printed command names as an example of theirs.
USERS_OWN = re.compile(r"/opt/|/path/to/|my\.yaml")
# A commit hash as the pages write one: 7 to 40 hex digits standing alone, on a line mixing digits and letters.
COMMIT = re.compile(r"(^|[ (`])[0-9a-f]{7,40}([ ),.:;`]|$)")
HEX_MIX = re.compile(r"[0-9][a-f]|[a-f][0-9]")
ISSUE = re.compile(r"\bissues? \d+", re.I)


def bash_lines(text: str, prefix: str) -> list[str]:
    """The commands of the ```bash blocks of `text` that start with `prefix` (continued lines joined,
    comments cut)."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line.startswith(prefix):
                commands.append(line)
    return commands


def sh(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """`command` as a user's shell runs it (a failing stage of a pipe fails it)."""
    return subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=ENV, capture_output=True, text=True)


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The workflow as a fresh clone has it, nothing built."""
    folder = copy_workflow(tmp_path_factory.mktemp("clone") / "kvlab")
    for name in ("docs", "profiles", "examples"):
        shutil.copytree(ROOT / name, folder / name, dirs_exist_ok=True)
    return folder


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


def test_the_readme_is_a_front_page_whose_links_resolve():
    assert len(README.splitlines()) <= 200
    for name, text in {"README.md": README, **DOCS}.items():
        base = ROOT if name == "README.md" else ROOT / "docs"
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert (base / target).exists(), f"{name} links to {target}, which does not exist"
    assert {"configuration.md", "own-minimind-files.md", "slurm.md", "measured.md", "troubleshooting.md"} <= set(DOCS)
    assert all(f"(docs/{page})" in README for page in DOCS), "the README links every page of docs/"
    assert "```mermaid" not in README


def test_the_reference_pages_say_how_things_are():
    """The README and docs/*.md say how things are: no heading starts with "Then", none of their lines names
    an issue, and at most 20 lines carry a commit hash (a latest measurement's, once a section); the trail
    of work, what was tried commit by commit, is in docs/log/."""
    then, issues, hashed = [], [], []
    for name, text in {"README.md": README, **DOCS}.items():
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        then += [f"{name}: {line}" for line in prose.splitlines() if re.match(r"#+ *Then\b", line)]
        issues += [f"{name}: {line}" for line in text.splitlines() if ISSUE.search(line)]
        hashed += [f"{name}: {line}" for line in text.splitlines() if COMMIT.search(line) and HEX_MIX.search(line)]
    assert not then, f"headings that start with 'Then' (the trail belongs in docs/log/): {then}"
    assert not issues, f"lines that name an issue (describe the feature instead): {issues}"
    assert len(hashed) <= 20, (f"{len(hashed)} lines carry a commit hash, at most 20: keep the latest measurement's, "
                               "once a section, and move the rest to docs/log/:\n" + "\n".join(hashed))


def printed_snakemake_commands() -> list[tuple[str, str]]:
    """(page, command) for every `snakemake` command the README and docs/ print, but those that name
    a user's own files, draw a graph (tested below) or write the HTML report (tests/test_extras.py)."""
    found = []
    for name, text in {"README.md": README, **DOCS}.items():
        for command in bash_lines(text, "snakemake") + [c.split("&& ", 1)[1] for c in bash_lines(text, "pip install")
                                                         if "&& snakemake" in c]:
            if USERS_OWN.search(command) or "|" in command or "--report" in command:
                continue
            found.append((name, command))
    return found


@pytest.mark.parametrize("page, command", printed_snakemake_commands())
def test_every_printed_command_runs_as_printed(clone, page, command):
    """As a dry run (-n) in a fresh clone: the command's flags, config and targets are all valid."""
    if "--profile profiles/slurm" in command and not plugin_installed():
        pytest.skip("snakemake-executor-plugin-slurm is not installed")
    words = shlex.split(command)
    result = subprocess.run([sys.executable, "-m", *words[:1], "-n", *words[1:]], cwd=clone, env=ENV,
                            capture_output=True, text=True)
    assert result.returncode == 0, f"{page}: {command}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"


def test_dag_commands_draw_as_printed(clone):
    commands = bash_lines(README, "snakemake --dag")
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
        rules, _, _ = svg_graph(clone / command.split("-o")[-1].strip())
        if "results/topp.json" in command:  # one target: it and its ancestors, nothing else
            assert rules == {"corpus", "tokenizer", "pretrain", "inspect_checkpoint", "topp"}, rules
        else:
            assert {"all", "report", "check", "topp", "pretrain"} <= rules, rules
    assert all(re.fullmatch(r"dag\w*\.svg", command.split("-o")[-1].strip()) for command in commands)
    ignored = subprocess.run(["git", "check-ignore", "dag.svg", "dag_topp.svg"], cwd=ROOT, capture_output=True,
                             text=True)
    assert ignored.stdout.split() == ["dag.svg", "dag_topp.svg"], "the drawn graphs must not show as untracked"


def test_rulegraph_picture_is_what_its_command_draws(clone, tmp_path):
    """docs/rulegraph.svg holds every rule but `all`, `check` and grading's, top to bottom, and redrawing it with
    the printed command gives the same graph; without Graphviz the command leaves the picture whole."""
    committed = ROOT / "docs" / "rulegraph.svg"
    assert "](docs/rulegraph.svg)" in README
    rules, edges, heights = svg_graph(committed)
    listed = sh("snakemake --list-rules", clone)
    assert listed.returncode == 0, listed.stderr[-3000:]
    grading = {"grade", "grade_student", "grade_class", "figure_class_scores", "figure_class_tests", "class_page"}
    assert rules == set(listed.stdout.split()) - {"all", "check"} - grading, "redraw docs/rulegraph.svg with its command"
    assert heights["corpus"] < heights["pretrain"] < heights["report"]  # top to bottom
    [command] = [line for line in bash_lines(DOCS["workflow.md"], "PYTHONHASHSEED=0 snakemake --rulegraph")
                 if "docs/rulegraph.svg" in line]
    # no Graphviz: a PATH with this Python but no `dot`
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    snakemake_bin = Path(sys.executable).parent / "snakemake"
    (tmp_path / "bin" / "snakemake").symlink_to(snakemake_bin)
    without_dot = subprocess.run(["/bin/bash", "-o", "pipefail", "-c", command], cwd=clone, capture_output=True,
                                 text=True, env={**ENV, "PATH": f"{tmp_path / 'bin'}:/usr/bin/env-only"})
    assert without_dot.returncode != 0 and svg_graph(clone / "docs" / "rulegraph.svg")[0] == rules
    if shutil.which("dot") is None:
        pytest.skip(NO_DOT)
    result = sh(command, clone)
    assert result.returncode == 0, result.stderr[-3000:]
    redrawn_rules, redrawn_edges, _ = svg_graph(clone / "docs" / "rulegraph.svg")
    assert (redrawn_rules, redrawn_edges) == (rules, edges)


def test_the_configuration_page_is_what_the_schema_says():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "config_docs.py")], capture_output=True, text=True,
                            check=True)
    assert result.stdout == DOCS["configuration.md"], "regenerate: python tools/config_docs.py > docs/configuration.md"
    for key in ("lab.topp.ps", "extras.sweep.new_tokens", "model_overrides.num_attention_heads", "report.language"):
        assert f"| `{key}` |" in result.stdout, key


def test_the_install_line_pins_the_torch_of_pyproject():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    [torch_pin] = [d for d in dependencies if d.startswith("torch==")]
    assert set(re.findall(r"torch==[\d.]+", README)) == {torch_pin}
    [cpu] = [line for line in bash_lines(README, "pip install torch") if "download.pytorch.org/whl/cpu" in line]
    assert cpu.startswith(f"pip install {torch_pin} --index-url")
    quickstart = README.split("## Quickstart")[1].split("\n## ")[0]
    assert quickstart.index(torch_pin) < quickstart.index("pip install -e . && snakemake --cores 1"), \
        "the torch build is chosen before kvlab is installed"


def test_fixed_numbers_agree_with_the_formulas():
    """The counts and bytes docs/measured.md calls fixed by the config follow from its own P, N and
    shapes, wherever the docs quote them."""
    measured = DOCS["measured.md"]
    p, n = map(int, re.search(r"P = (\d+), N = (\d+) \|", measured).groups())
    fed = fed_formulas(p, n)
    row = re.search(r"\| ([\d,]+) with the cache \(P\+N−1\), ([\d,]+) without .*?\*\*([\d.]+)×\*\*", measured)
    assert (int(row[1].replace(",", "")), int(row[2].replace(",", ""))) == (fed["with_cache"], fed["without_cache"])
    assert row[3] == f"{fed['without_cache'] / fed['with_cache']:.1f}"
    results = DOCS["results.md"]
    assert f"fed_with_cache={fed['with_cache']}, P+N-1={fed['with_cache']} (P={p}, N={n})" in results
    assert f"fed_without_cache={fed['without_cache']}, P*N+N(N-1)/2={fed['without_cache']} (P={p}, N={n})" in results
    assert f"{fed_formulas(p, 256)['without_cache']:,} tokens" in results  # the sweep's longest run
    kv = re.search(r"\*\*([\d,]+)\*\* = 2 × (\d+) layers × (\d+) × (\d+) KV heads × (\d+) × (\d+) bytes, "
                   r"`k_shape` \[1, (\d+), (\d+), (\d+)\]", measured)
    layers, tokens, heads, head_dim, width = map(int, kv.groups()[1:6])
    assert int(kv[1].replace(",", "")) == 2 * layers * tokens * heads * head_dim * width
    assert list(map(int, kv.groups()[6:])) == [tokens, heads, head_dim]
    assert f"measured_bytes={int(kv[1].replace(',', ''))}, formula_bytes={int(kv[1].replace(',', ''))}" in results
    assert re.search(r"commit [0-9a-f]{7}", measured), "measurements name the commit they came from"


# --- the layout lists, held to the tree ----------------------------------------------------------------

def layout_entries(text: str, heading: str) -> dict[str, str]:
    """The code block under `heading`, as {path: what it says}: an entry starts at the line's first column,
    its text goes on in the indented lines under it."""
    block = text.split(heading, 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    for line in block.splitlines()[1:]:
        if line[:1].strip():
            path, _, said = line.partition(" ")
            entries[path] = said
        elif line.strip() and entries:
            entries[path] += " " + line.strip()
    return entries


def named(word: str, text: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(word)}(?![\w])", text) is not None


def modules_of(package: Path) -> list[str]:
    return sorted(path.stem for path in package.glob("*.py") if not path.name.startswith("__"))


PACKAGES = sorted(path.parent for path in (ROOT / "kvlab").glob("*/__init__.py"))
TOP_MODULES = modules_of(ROOT / "kvlab")
RULE_FILES = sorted(path.name for path in (ROOT / "rules").glob("*.smk"))
# a name of a module or a file as the lists write them (snake_case), which must be one of the tree's
SNAKE = re.compile(r"(?<![\w./])[a-z]+(?:_[a-z]+)+(?![\w(])")


def test_the_development_layout_names_every_module_rule_file_and_tool():
    """docs/development.md's layout, "in full": each kvlab/<package>/ entry names every module of its
    package, and names none that is not one; every kvlab/*.py, rules/*.smk and tools/*.py is named;
    every path it names exists."""
    entries = layout_entries(DOCS["development.md"], "## The layout, in full")
    for package in PACKAGES:
        said = entries.get(f"kvlab/{package.name}/")
        assert said is not None, f"docs/development.md's layout has no entry for kvlab/{package.name}/"
        missing = [module for module in modules_of(package) if not named(module, said)]
        assert not missing, f"kvlab/{package.name}/ in docs/development.md's layout does not name {missing}"
        stale = [word for word in SNAKE.findall(said) if word not in modules_of(package)
                 and not (ROOT / "kvlab" / package.name / word).is_dir()]
        assert not stale, f"kvlab/{package.name}/ in docs/development.md's layout names no module of it: {stale}"
    unnamed = ([f"kvlab/{module}.py" for module in TOP_MODULES if f"kvlab/{module}.py" not in entries]
               + [f"rules/{name}" for name in RULE_FILES if f"rules/{name}" not in entries]
               + [f"tools/{path.name}" for path in (ROOT / "tools").glob("*.py")
                  if not named(path.name, entries["tools/"])])
    assert not unnamed, f"docs/development.md's layout does not name {unnamed}"
    gone = [path for path in entries if not (ROOT / path.rstrip("/")).exists()]
    assert not gone, f"docs/development.md's layout names what is not in the tree: {gone}"


def test_the_readme_layout_names_every_package_module_and_rule_file():
    """The README's short layout: an entry for every kvlab/<package>/, every kvlab/*.py named (in the
    kvlab/config.py entry) and every rules/*.smk (in the rules/ entry); what it names as a module of a
    package (snake_case) is one."""
    entries = layout_entries(README, "## Layout")
    unnamed = ([f"kvlab/{package.name}/" for package in PACKAGES if f"kvlab/{package.name}/" not in entries]
               + [f"kvlab/{module}.py" for module in TOP_MODULES
                  if module != "config" and not named(f"{module}.py", entries["kvlab/config.py"])]
               + [f"rules/{name}" for name in RULE_FILES if not named(name.removesuffix(".smk"), entries["rules/"])])
    assert not unnamed, f"the README's layout does not name {unnamed}"
    for package in PACKAGES:
        stale = [word for word in SNAKE.findall(entries[f"kvlab/{package.name}/"]) if word not in modules_of(package)]
        assert not stale, f"kvlab/{package.name}/ in the README's layout names no module of it: {stale}"
