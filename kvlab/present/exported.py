"""The build's models in other tools, for beyond.md (results/export/{model}/checks.json, kvlab.export,
built where extras.export.in_build asks): whether kvlab, transformers and llama.cpp give the same greedy
tokens on the lab's prompt, or where each first differs, and whether the exported tokenizers give kvlab's
ids. The sentence's every clause is chosen here from the records.

Free of PyTorch.
"""

from __future__ import annotations

PREFIX = "export_"


def export_section(results: dict) -> dict:
    """{"export": None} where this build exported nothing (the section is left out); else what
    differs (a model, a system and the new token, counted from 1, where it first differs)
    and transformers' largest logit difference over the models."""
    checks = {name.removeprefix(PREFIX): record for name, record in results.items() if name.startswith(PREFIX)}
    if not checks:
        return {"export": None}
    first = next(iter(checks.values()))
    tokens_differ, tokenizers_differ = [], []
    for model, record in checks.items():
        for system, checked in record["systems"].items():
            if not checked["same_tokens"]:
                tokens_differ.append({"model": model, "system": system,
                                      "at": checked["first_difference"]["position"] + 1})
            if checked["tokenizer_differs"]:
                tokenizers_differ.append({"model": model, "system": system, "texts": checked["tokenizer_differs"]})
    logits = [record["systems"]["transformers"]["max_logit_difference"] for record in checks.values()
              if record["systems"].get("transformers", {}).get("max_logit_difference") is not None]
    return {"export": {
        "new_tokens": first["new_tokens"],
        "texts": first["tokenizer_texts"], "file_type": first["systems"].get("llama.cpp", {}).get("file_type"),
        "tokens_differ": tokens_differ, "tokenizers_differ": tokenizers_differ,
        "max_logit": max(logits) if logits else None,
    }}
