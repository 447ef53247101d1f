"""One export, refused or written and checked (`kvlab export`, rule `export`): see the package."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import torch

from kvlab.engine.checkpoint import load_model
from kvlab.engine.model import MiniMindForCausalLM
from kvlab.engine.sampling import GREEDY
from kvlab.engine.tokenizer import load_tokenizer, vocab_mismatch
from kvlab.export import gguf_file, hf
from kvlab.facts.results import EXPORT_RUN
from kvlab.facts.tokens import first_difference
from kvlab.io import write_json_atomic

TARGETS = ("hf", "gguf")
RECORD = "kvlab_export.json"  # inside the folder; a GGUF's record is beside it, OUT.json


class ExportError(ValueError):
    """What cannot be exported, in one line that names the field or the file."""


def refusal(model: MiniMindForCausalLM, tokenizer, to: str, out: Path) -> str | None:
    """Why this export cannot be made, before anything is written; None where it can."""
    if to not in TARGETS:
        return f"--to must be one of {', '.join(TARGETS)}, got {to!r}"
    mismatch = vocab_mismatch(tokenizer.vocab_size, model.config.vocab_size)
    if mismatch:
        return f"the tokenizer does not belong to the checkpoint: {mismatch}"
    if out.exists() or (to == "gguf" and record_path(to, out).exists()):
        return f"{out}: already there (an export is written whole into a path that is free)"
    if to == "gguf":
        if out.suffix != ".gguf":
            return f"{out}: a GGUF export's file name ends in .gguf"
        for package, name in (("gguf", "gguf"), ("llama_cpp", "llama-cpp-python")):
            if importlib.util.find_spec(package) is None:
                return f"{name} is not installed: pip install -e '.[export,llama]' (the file is checked in llama.cpp)"
    elif importlib.util.find_spec("transformers") is None:
        return "transformers is not installed: pip install 'kvlab[export]' (the folder is checked in transformers)"
    return None


def record_path(to: str, out: Path) -> Path:
    return out / RECORD if to == "hf" else out.with_suffix(".json")


def remove(path: Path) -> None:
    """A partial export gone, folder or file."""
    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def export(checkpoint: Path, tokenizer_dir: Path, to: str, out: Path, prompt: list[int], texts: list[str],
           file_type: str = "f32", new_tokens: int = 64, overrides: dict | None = None) -> dict:
    """Export the checkpoint to `out` and check it there: see the package. `overrides` are the config
    fields a checkpoint does not reveal (the workflow's model_overrides). Returns the record (also
    written beside the export); raises ExportError, with nothing written, where it cannot be made."""
    return export_all(checkpoint, tokenizer_dir, {to: out}, prompt, texts, file_type, new_tokens, overrides)[to]


def export_all(checkpoint: Path, tokenizer_dir: Path, outs: dict[str, Path], prompt: list[int], texts: list[str],
               file_type: str = "f32", new_tokens: int = 64, overrides: dict | None = None) -> dict[str, dict]:
    """`export` to each target of `outs` ({to: out}) from one load of the checkpoint and one run of kvlab's
    generate; every target refused or not before any is written. Returns the records by target."""
    model = load_model(checkpoint, **(overrides or {})).eval()
    tokenizer = load_tokenizer(tokenizer_dir)
    outs = {to: Path(out) for to, out in outs.items()}
    for to, out in outs.items():
        why = refusal(model, tokenizer, to, out)
        if why:
            raise ExportError(why)
    expected = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, eos_token_id=None,
                              **GREEDY)[0, len(prompt):].tolist()
    records = {}
    for to, out in outs.items():
        partial = out.with_name(f".{out.name}.partial")
        remove(partial)
        try:
            if to == "hf":
                hf.write(model, Path(tokenizer_dir), partial)
                checked = hf.check(partial, model, prompt, expected, texts, tokenizer.encode)
            else:
                gguf_file.write(model, Path(tokenizer_dir) / "tokenizer.json", partial, file_type)
                checked = gguf_file.check(partial, prompt, new_tokens, texts, tokenizer.encode)
            at = first_difference(checked["tokens"], expected)
            differs = None if at is None else {"position": at, "got": checked["tokens"][at], "expected": expected[at]}
            records[to] = record = {
                "checkpoint": str(checkpoint), "tokenizer": str(tokenizer_dir), "to": to,
                "file_type": file_type if to == "gguf" else "f32", "prompt_tokens": len(prompt),
                "new_tokens": new_tokens, "same_tokens": differs is None, "first_difference": differs,
                "kvlab_tokens": expected, **checked, "run": EXPORT_RUN[to].format(out=out)}
            write_json_atomic(record_path(to, partial) if to == "hf" else record_path(to, out), record)
            partial.rename(out)
        except BaseException:
            remove(partial)
            raise
    return records


# the system each target is checked in, as a reader names it
SYSTEMS = {"hf": "transformers", "gguf": "llama.cpp"}


def agrees(record: dict) -> bool:
    """Whether an export holds kvlab's greedy tokens and its tokenizer kvlab's ids."""
    return record["same_tokens"] and not record["tokenizer_differs"]


def said(record: dict, out: Path) -> str:
    """An export's checks in one sentence (the command prints it, the workflow's job logs it)."""
    tokens = ("the same" if record["same_tokens"] else
              f"not the same (the first differs at {record['first_difference']['position']})")
    return (f"{out}: {SYSTEMS[record['to']]} gives {tokens} {record['new_tokens']} greedy tokens as kvlab's generate; "
            f"its tokenizer differs on {record['tokenizer_differs']} of {record['tokenizer_texts']} texts")


def agreement(records: dict[str, dict]) -> dict:
    """One model's exports side by side (the workflow's checks.json, read by beyond.md): for each target's
    system, whether its greedy tokens are kvlab's or where they first differ, its tokenizer's differing
    texts, transformers' largest logit difference, and the versions it ran."""
    systems = {}
    for to, record in records.items():
        systems[SYSTEMS[to]] = {
            key: record.get(key) for key in ("same_tokens", "first_difference", "tokenizer_differs",
                                             "max_logit_difference", "file_type", "versions")}
    first = next(iter(records.values()))
    return {"checkpoint": first["checkpoint"], "new_tokens": first["new_tokens"],
            "tokenizer_texts": first["tokenizer_texts"], "systems": systems,
            "agree": all(agrees(record) for record in records.values())}
