"""Write docs/configuration.md from the config's schema (each key's type, limits and description)
and config.yaml (each key's default). A hand-run tool; tests/test_docs.py keeps the page current:

    python tools/config_docs.py > docs/configuration.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
NOT_SET = object()

INTRO = """\
# Configuration

`config.yaml` holds every key with its default (the lab sheet's values);
`schemas/config.schema.yaml` describes each one and checks the config before any job runs: an
unknown key, a wrong type, a temperature ≤ 0 or a top-p outside (0, 1] is refused with one line
naming the key. This page is generated from those two files
(`python tools/config_docs.py > docs/configuration.md`; a test keeps it current).

Change a key in `config.yaml`, or leave that file as it is and name only what you change:

```bash
snakemake --cores 1 --configfile my.yaml                                   # a YAML file of the keys you change
snakemake --cores 1 --config dtype=float16 report='{"language": "en"}'     # or on the command line
snakemake --cores 1 --config 'lab={"topp": {"ps": [0.5, 0.99]}}'           # nested: JSON (YAML flow) values
```

A nested `--config` value replaces only the keys it names (`lab.topp.ps` above; `lab.topp.prefix`
keeps its default). Changing a key reruns exactly the jobs that read it
([what reruns when](workflow.md#what-reruns-when)).
"""


def limits(schema: dict) -> str:
    """The schema's type of a key and its limits, in words."""
    kinds = schema.get("type", "")
    kinds = " or ".join(kinds) if isinstance(kinds, list) else kinds
    words = [kinds] if kinds else []
    if "enum" in schema:
        words = ["one of " + ", ".join(f"`{'null' if value is None else value}`" for value in schema["enum"])]
    for keyword, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤")):
        if keyword in schema:
            words.append(f"{sign} {schema[keyword]}")
    if "minLength" in schema:
        words.append("not empty")
    items = schema.get("items")
    if isinstance(items, dict) and "type" in items and items["type"] != "object":
        words.append(f"of {limits(items)}")
    if "minItems" in schema:
        words.append(f"at least {schema['minItems']}")
    return ", ".join(words)


def shown(value) -> str:
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def resolved(schema: dict, root: dict) -> dict:
    """`schema` with a local `$ref` ("#/$defs/NAME") merged in."""
    if "$ref" not in schema:
        return schema
    target = root
    for part in schema["$ref"].removeprefix("#/").split("/"):
        target = target[part]
    merged = {**target, **schema}
    merged["properties"] = {**target.get("properties", {}), **schema.get("properties", {})}
    merged["required"] = target.get("required", []) + schema.get("required", [])
    return merged


def rows(schema: dict, config, path: str, root: dict) -> list[str]:
    """One table row per key below `path` (objects flattened into dotted keys); a key the config
    leaves out (an optional one, such as a model override) is "not set"."""
    schema = resolved(schema, root)
    if schema.get("type") == "object" and "properties" in schema and isinstance(config, dict):
        out = []
        for key, sub in schema["properties"].items():
            out += rows(sub, config.get(key, NOT_SET), f"{path}.{key}", root)
        return out
    description = schema.get("description", "").replace("|", "\\|")
    default = "not set" if config is NOT_SET else shown(config)
    return [f"| `{path}` | {limits(schema)} | {default} | {description} |"]


def entry_table(schema: dict, root: dict) -> list[str]:
    """The fields of one entry of a list of objects."""
    item = resolved(schema["items"], root)
    required = set(item.get("required", []))
    lines = ["| field | type | what it is |", "|---|---|---|"]
    for key, sub in item["properties"].items():
        sub = resolved(sub, root)
        kind = limits(sub) or "object"
        if sub.get("properties"):
            kind = "object: " + ", ".join(f"`{name}`" for name in sub["properties"])
        need = " (required)" if key in required else ""
        lines.append(f"| `{key}`{need} | {kind} | {sub.get('description', '')} |")
    return lines


def page(schema: dict, config: dict) -> str:
    out = [INTRO]
    header = ["| key | type | default | what it is |", "|---|---|---|---|"]
    scalars = [key for key, sub in schema["properties"].items()
               if resolved(sub, schema).get("type") not in ("object", "array")]
    out += ["## Inputs and where the model runs", ""] + header
    for key in scalars:
        out += rows(schema["properties"][key], config[key], key, schema)
    for key, sub in schema["properties"].items():
        if key in scalars:
            continue
        out += ["", f"## `{key}`", "", sub.get("description", ""), ""] + header + rows(sub, config[key], key, schema)
        lists = [(f"{key}", sub)] if sub.get("type") == "array" else []
        lists += [(f"{key}.{name}.{inner}", spec) for name, group in sub.get("properties", {}).items()
                  for inner, spec in group.get("properties", {}).items() if spec.get("type") == "array"
                  and isinstance(spec.get("items"), dict) and "properties" in resolved(spec["items"], schema)]
        for name, spec in lists:
            out += ["", f"Each entry of `{name}`:", ""] + entry_table(spec, schema)
    return "\n".join(out) + "\n"


def main() -> int:
    schema = yaml.safe_load((ROOT / "schemas" / "config.schema.yaml").read_text(encoding="utf-8"))
    config = yaml.safe_load((ROOT / "config.yaml").read_text(encoding="utf-8"))
    sys.stdout.write(page(schema, config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
