"""The config against schemas/config.schema.yaml: values typed as the schema says, and one-line
messages for a config that does not match it."""

from __future__ import annotations

import jsonschema
import yaml

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
