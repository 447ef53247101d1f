"""The workflow's config, checked once before any job runs: values typed as the schema
(schemas/config.schema.yaml) says, one-line messages for a config that does not match it, every check
the schema cannot state (files that must exist, keys that must agree), and what the config names:
the inputs (the user's files or the embedded default's), the models compared and the checkpoints
inspected. rules/common.smk calls these and stops the run with the message of a ConfigError.

Free of PyTorch: Snakemake's own process runs it for `-n`, --dag, --lint and --report too."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import jsonschema
import yaml

from kvlab.facts.compare import LAB_NAME, parameter_estimate
from kvlab.facts.results import RESULTS
from kvlab.grade import classroom
from kvlab.grade.check import Settings
from kvlab.facts.formulas import request_blocks
from kvlab.measure.minimind_src import MiniMindSourceError, check_source_path

# JSON schema types and the Python values that are of them.
PYTHON_TYPES = {"integer": int, "number": (int, float), "boolean": bool, "null": type(None), "array": list,
                "object": dict, "string": str}


def load_schema(schema_path) -> dict:
    with open(schema_path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def typed_by_schema(value, schema: dict, root: dict | None = None):
    """`value` with every string that the schema does not allow where it stands, but whose YAML
    reading it does, replaced by that reading. Snakemake's `--config key=VALUE` reads a nested value
    (`lab={"topp": {"ps": [0.5, 0.99]}}`) with YAML's base loader, which leaves every number a
    string; this gives them back their types. Anything else is left for validation to judge."""
    root = root if root is not None else schema
    if "$ref" in schema:  # the schema's own definitions: "#/$defs/NAME"
        referenced = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            referenced = referenced[part]
        schema = {**referenced, **{key: item for key, item in schema.items() if key != "$ref"}}
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        return {key: typed_by_schema(item, properties[key], root) if key in properties else item
                for key, item in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [typed_by_schema(item, schema["items"], root) for item in value]
    allowed = schema.get("type")
    if isinstance(value, str) and allowed is not None:
        types = tuple(PYTHON_TYPES[name] for name in ([allowed] if isinstance(allowed, str) else allowed))
        if str not in types:
            try:
                read = yaml.safe_load(value)
            except yaml.YAMLError:
                return value
            if isinstance(read, types) and not (isinstance(read, bool) and bool not in types):
                return read
    return value


def config_error(config: dict, schema_path) -> str | None:
    """The most relevant schema violation as one line naming the key, or None if the config is valid."""
    schema = load_schema(schema_path)
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(config))
    if error is None:
        return None
    key = ".".join(str(part) for part in error.absolute_path) or "(top level)"
    if error.validator in ("additionalProperties", "unevaluatedProperties"):
        return f"config: {error.message} under '{key}'; see schemas/config.schema.yaml for the keys"
    expected = error.schema.get("description", "")
    detail = f" (expected: {expected})" if expected else ""
    return f"config key '{key}': {error.message}{detail}"


class ConfigError(ValueError):
    """A config the workflow cannot run: one line naming the key and what was expected."""


def by_value(value):
    """`value` with the keys of every mapping in it sorted. Snakemake records a job's params by
    repr(), so a dict's key order would count as a change; sorted, two configs equal by value
    (keys reordered, a comment added, 0.30 written for 0.3) record the same params."""
    if isinstance(value, dict):
        return {key: by_value(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [by_value(item) for item in value]
    return value


# --- the inputs: the user's files, or the embedded default's ------------------------------------

# Where each input comes from when its config key is null: the embedded default's rules write these.
DEFAULT_INPUTS = {
    "pretrain": "results/default/pretrain.pth",
    "sft": "results/default/sft.pth",
    "tokenizer": "results/default/tokenizer",
    "val_data": "results/default/corpus/pretrain_val.jsonl",
}


def configured_inputs(config: dict) -> dict[str, str]:
    """The paths the user gave (the inputs above and minimind_src), each checked to exist now, so a
    wrong one stops the run in one line before any rule asks for it."""
    found = {}
    for key in (*DEFAULT_INPUTS, "minimind_src"):
        if not config[key]:
            continue
        path = Path(config[key]).expanduser()
        if key == "tokenizer":
            if not (path / "tokenizer.json").is_file():
                raise ConfigError(f"config key 'tokenizer': {path} is not a folder with a tokenizer.json")
        elif key == "minimind_src":
            try:
                check_source_path(path)
            except MiniMindSourceError as err:
                raise ConfigError(f"config key 'minimind_src': {err}") from None
        elif not path.is_file():
            raise ConfigError(f"config key '{key}': file not found: {path}")
        found[key] = str(path)
    return found


# --- the checks the schema cannot state ------------------------------------------------------------

# Names the lab's own checkpoints go by (results/checkpoints/NAME.json): no compared model may take them.
RESERVED_NAMES = (LAB_NAME, "pretrain", "sft")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")
ARCHITECTURE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")


def check_config(config: dict) -> None:
    """Raise ConfigError for the first setting that the schema lets through but the lab cannot run:
    models to compare, capacity architectures, the anatomy's contexts, a batch prompt longer than the
    lab's, serving settings that serve nothing, a folder to check that is not there, an answer key that is not
    one for the lab's settings."""
    extras = config["extras"]
    lab_prompt_len = config["lab"]["prompt"]["cut_tokens"] + 1
    check_entries(config["compare"], extras["compare"]["prompt_tokens"], lab_prompt_len)
    for index, arch in enumerate(extras["capacity"]["architectures"]):
        check_architecture(arch, f"config key 'extras.capacity.architectures[{index}]'")
    contexts = extras["step_anatomy"]["contexts"]
    if contexts != sorted(set(contexts)):
        raise ConfigError(f"config key 'extras.step_anatomy.contexts': {contexts} should rise, each length once")
    if extras["batch"]["prompt_tokens"] > lab_prompt_len:
        raise ConfigError(f"config key 'extras.batch.prompt_tokens': {extras['batch']['prompt_tokens']} is longer "
                          f"than the lab's prompt (lab.prompt.cut_tokens + 1 = {lab_prompt_len})")
    check_serving(extras["serving"], lab_prompt_len)
    folder = checked_folder(config)
    if not checks_this_build(config) and not folder.is_dir():
        raise ConfigError(f"config key 'extras.check.results_dir': folder not found: {folder}")
    key = config["grade"]["key"]
    if key:
        lab = config["lab"]
        settings = Settings(temperatures=tuple(lab["temp"]["temperatures"]), samples=lab["temp"]["samples"],
                            ps=tuple(lab["topp"]["ps"]))
        problem = classroom.key_problem(Path(key).expanduser(), settings)
        if problem:
            raise ConfigError(f"config key 'grade.key': {problem}")


def check_serving(serving: dict, lab_prompt_len: int) -> None:
    """Raise ConfigError for extras.serving settings under which some request of a trace could not be
    served: every prompt must fit one step's budget and every request the pools (the longest the
    settings allow: the trace's prompt_cap, the shared-prefix trace's lab prompt and question, each
    with max_tokens_max)."""
    s, where = serving, "config key 'extras.serving."
    for low, high in (("prompt_min", "prompt_cap"), ("max_tokens_min", "max_tokens_max")):
        if s[low] > s[high]:
            raise ConfigError(f"{where}{low}': {s[low]} is more than {high} ({s[high]})")
    if s["parallel_n"] > s["slots"]:
        raise ConfigError(f"{where}parallel_n': {s['parallel_n']} samples run together, more than the "
                          f"{s['slots']} slots (extras.serving.slots)")
    prefix_prompt = lab_prompt_len + s["question_tokens"]
    longest = max(s["prompt_cap"], prefix_prompt)
    if s["max_batched_tokens"] < longest:
        raise ConfigError(f"{where}max_batched_tokens': {s['max_batched_tokens']} fits nothing: a prompt is fed "
                          f"whole in one step, and the longest has {longest} tokens (prompt_cap, or the lab's "
                          f"prompt + question_tokens)")
    size, most = s["block_size"], s["max_tokens_max"]
    samples = s["parallel_n"]
    needs = {"the trace's longest request": request_blocks(s["prompt_cap"], most, 1, size),
             "the shared-prefix trace's": request_blocks(prefix_prompt, most, 1, size),
             f"a request of n = {samples} samples": request_blocks(s["prompt_cap"], most, samples, size)}
    for what, needed in needs.items():
        if needed > s["num_blocks"]:
            raise ConfigError(f"{where}num_blocks': {s['num_blocks']} blocks of {size} tokens cannot hold {what} "
                              f"({needed} blocks with max_tokens_max {most})")
    if s["tight_blocks"] >= s["num_blocks"]:
        raise ConfigError(f"{where}tight_blocks': {s['tight_blocks']} is no tighter than num_blocks "
                          f"({s['num_blocks']})")
    trace_needs = needs["the trace's longest request"]
    if s["tight_blocks"] < trace_needs:
        raise ConfigError(f"{where}tight_blocks': {s['tight_blocks']} blocks of {size} tokens cannot hold the "
                          f"trace's longest request (prompt_cap {s['prompt_cap']} + max_tokens_max {most}: "
                          f"{trace_needs} blocks)")


def checked_folder(config: dict) -> Path:
    """The folder `check` grades (extras.check.results_dir)."""
    return Path(config["extras"]["check"]["results_dir"]).expanduser()


def checks_this_build(config: dict) -> bool:
    """Whether `check` grades this build's own results (then it waits for them, and holds them to no
    key: they are the key)."""
    return checked_folder(config).resolve() == Path("results").resolve()


def folder_name(config: dict) -> str:
    """The name another folder's check goes by (results/check/NAME.json): the folder's name (letters,
    digits, . _ - kept) and 8 hex digits of its absolute path, so that two students' folders both named
    `results` keep apart."""
    folder = checked_folder(config).resolve()
    name = re.sub(r"[^A-Za-z0-9._-]", "_", folder.name) or "folder"
    return f"{name}-{hashlib.sha256(str(folder).encode('utf-8')).hexdigest()[:8]}"


def check_output(config: dict) -> str:
    """The file `check` writes its verdicts to: results/check.json for this build's own folder
    (kvlab.facts.results' `check`), results/check/NAME.json for another (`folder_check`), so that
    checking a student's folder never overwrites, nor on failure deletes, the build's own."""
    if checks_this_build(config):
        return RESULTS["check"].path
    return RESULTS["folder_check"].path.format(folder=folder_name(config))


def check_log(config: dict) -> str:
    """The stem of `check`'s two logs (.log, the table; .json, the verdicts, kept when it fails):
    results/logs/check for this build's folder, results/logs/check/NAME for another."""
    return "results/logs/check" + ("" if checks_this_build(config) else f"/{folder_name(config)}")


def answer_key(config: dict) -> dict[str, str]:
    """The answer key's files, {name: path} of kvlab.grade.classroom.KEY_RESULTS, that `grade` and
    `check` on another folder hold a folder to: grade.key's folder, or this build's own results on the
    same checkpoints (then the jobs wait for the lab's jobs that write them)."""
    if config["grade"]["key"]:
        return classroom.key_files(Path(config["grade"]["key"]).expanduser())
    return {name: RESULTS[name].path for name in classroom.KEY_RESULTS}


def check_entries(entries: list[dict], prompt_tokens: int, lab_prompt_len: int) -> None:
    """Raise ConfigError for the first `compare` entry the config alone shows to be wrong."""
    seen = set(RESERVED_NAMES)
    for index, entry in enumerate(entries):
        where = f"config key 'compare[{index}]'"
        name = entry.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise ConfigError(f"{where}.name: {name!r} must be letters, digits, '-' or '_' (it names a folder)")
        where = f"config key 'compare[{index}]' ({name})"
        if name in seen:
            reasons = {LAB_NAME: "is the lab's own model, always the first row",
                       "pretrain": "names the lab's pretrained checkpoint", "sft": "names the lab's SFT checkpoint"}
            raise ConfigError(f"{where}.name: {name!r} {reasons.get(name, 'is used twice')}")
        seen.add(name)
        has_checkpoint, has_architecture = "checkpoint" in entry, "architecture" in entry
        if has_checkpoint == has_architecture:
            raise ConfigError(f"{where}: give exactly one of 'checkpoint' and 'architecture' "
                              f"(found {'both' if has_checkpoint else 'neither'})")
        if has_architecture:
            check_architecture(entry["architecture"], f"{where}.architecture")
        elif "model_overrides" in entry and not isinstance(entry["model_overrides"], dict):
            raise ConfigError(f"{where}.model_overrides: expected a mapping of MiniMind config fields")
    if prompt_tokens > lab_prompt_len:
        raise ConfigError(f"config key 'extras.compare.prompt_tokens': {prompt_tokens} is longer than the lab's "
                          f"prompt ({lab_prompt_len} tokens, bos included: lab.prompt.cut_tokens + 1)")


def check_architecture(arch: dict, where: str) -> None:
    """Raise ConfigError, naming the key under `where`, for an architecture MiniMind cannot build."""
    missing = [key for key in ARCHITECTURE_KEYS if key not in arch]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    heads, kv_heads, hidden = arch["num_attention_heads"], arch["num_key_value_heads"], arch["hidden_size"]
    if heads % kv_heads:
        raise ConfigError(f"{where}.num_key_value_heads: {kv_heads} does not divide num_attention_heads={heads}")
    head_dim = arch.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(f"{where}.num_attention_heads: {heads} does not divide hidden_size={hidden} "
                              f"(or give head_dim)")
        head_dim = hidden // heads
    if head_dim % 2:
        raise ConfigError(f"{where}.head_dim: {head_dim} must be even (rotary embeddings turn pairs of values)")


# --- what the config names: the models compared, the checkpoints inspected ----------------------------


def compare_entries(config: dict) -> dict[str, dict]:
    """The models compared (rules/compare.smk), by name: the lab's (its pretrained checkpoint), then the
    configured ones. A checkpoint this workflow does not make must exist now."""
    entries = {LAB_NAME: {"name": LAB_NAME, "inspected": "pretrain"}}
    for index, entry in enumerate(config["compare"]):
        entry = dict(entry)
        if "checkpoint" in entry:
            path = Path(entry["checkpoint"]).expanduser()
            if not path.is_file() and not str(path).startswith("results/"):
                raise ConfigError(f"config key 'compare[{index}]' ({entry['name']}).checkpoint: file not found: {path}")
            entry.update(checkpoint=str(path), inspected=entry["name"])
        entries[entry["name"]] = entry
    return entries


def checkpoints(config: dict, inputs: dict[str, str], entries: dict[str, dict]) -> dict[str, dict]:
    """Every checkpoint one `inspect_checkpoint` job inspects, by name: the lab's two (from `inputs`,
    the paths of the input keys) and each compared model's, with its config key and model_overrides;
    `built`, for the embedded default's (an input key left null), the model it was built with
    (default_model.model: what its file cannot show, such as max_position_embeddings)."""
    found = {key: {"path": inputs[key], "config_key": key, "overrides": config["model_overrides"],
                   "compared_as": None, "built": None if config[key] else dict(config["default_model"]["model"])}
             for key in ("pretrain", "sft")}
    for name, entry in entries.items():
        if "checkpoint" in entry:
            # the config key and the entry's name: its index would rerun it when one before goes
            found[name] = {"path": entry["checkpoint"], "config_key": "compare",
                           "overrides": entry.get("model_overrides", {}), "compared_as": name, "built": None}
    return found


def tokenizer_files(folder: str, given: bool) -> dict[str, str]:
    """The tokenizer folder's files a job reads, named (Snakemake tracks files, not folders): its
    tokenizer.json, and its tokenizer_config.json where the embedded default writes one or the user's
    folder (`given`) has one."""
    files = {"tokenizer": f"{folder}/tokenizer.json"}
    if not given or Path(folder, "tokenizer_config.json").is_file():
        files["tokenizer_config"] = f"{folder}/tokenizer_config.json"
    return files


def compare_inputs(entry: dict, checkpoints: dict[str, dict], prompt: str) -> dict[str, str]:
    """A compared model's job inputs: the lab's prompt, and its checkpoint with that checkpoint's
    inspection, when it has one (an architecture entry has none)."""
    files = {"prompt": prompt}
    if "inspected" in entry:
        name = entry["inspected"]
        files["checkpoint"] = checkpoints[name]["path"]
        files["checkpoint_inspected"] = f"results/checkpoints/{name}.json"
    return files


def compare_weight_bytes(entry: dict, checkpoint: str | None) -> int:
    """A compared model's weights in float16: from its architecture, or its checkpoint's size."""
    size = Path(checkpoint).stat().st_size if checkpoint else 0
    return 2 * parameter_estimate(entry, size)
