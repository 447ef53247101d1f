"""One-line messages for a config that does not match schemas/config.schema.yaml."""

from __future__ import annotations

import jsonschema
import yaml


def config_error(config: dict, schema_path) -> str | None:
    """The most relevant schema violation as one line naming the key, or None if the config is valid."""
    with open(schema_path, encoding="utf-8") as f:
        schema = yaml.safe_load(f)
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(config))
    if error is None:
        return None
    key = ".".join(str(part) for part in error.absolute_path) or "(top level)"
    if error.validator in ("additionalProperties", "unevaluatedProperties"):
        return f"config: {error.message} under '{key}'; see schemas/config.schema.yaml for the keys"
    expected = error.schema.get("description", "")
    detail = f" (expected: {expected})" if expected else ""
    return f"config key '{key}': {error.message}{detail}"
