"""Measure whether the embedded default models are good enough for the lab's lessons to show.
A hand-run tool (not a rule), after a build of the default:

    python tools/check_default_model.py [--config config.yaml]

The lab's question, prefixes, temperatures, samples and seed are the config's (lab.temp, lab.topp),
the models and tokenizer the embedded default's (results/default/). Prints the figures as JSON and
exits 1 when a bar fails:
  * greedy SFT answer to the lab question names the village's specialty;
  * at the lowest temperature, at least 24 of 30 sampled answers name it;
  * at the highest, at least 20 of 30 sampled answers are distinct;
  * pretrained model, next token after [bos] + lab.topp.prefix: top-p 0.9 keeps more than 10 tokens;
  * after [bos] + lab.topp.sharp_prefix: top-p 0.9 keeps at most 3.
Sampling follows the lab exactly (kvlab.measure.steps): torch.manual_seed(seed) before each temperature.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import yaml

from kvlab.default_model.corpus import LAB_VILLAGE
from kvlab.engine.checkpoint import load_model
from kvlab.engine.tokenizer import load_tokenizer
from kvlab.measure import steps

ROOT = Path(__file__).resolve().parent.parent
BARS = {"named_at_lowest": 24, "distinct_at_highest": 20, "broad_topp_0.9_more_than": 10, "sharp_topp_0.9_at_most": 3}


def measure(pretrain, sft_model, tokenizer, lab: dict, expect: str) -> dict:
    """The figures and the bars' verdicts, for the lab's settings `lab` (config["lab"])."""
    temp, topp = lab["temp"], lab["topp"]
    device = torch.device("cpu")
    chat, prompt_ids = steps.chat_prompt(tokenizer, temp["question"])
    out = sft_model.generate(torch.tensor([prompt_ids]), max_new_tokens=temp["max_new_tokens"], do_sample=False,
                             top_k=0, top_p=1.0, eos_token_id=tokenizer.eos_id)
    greedy = steps.answer_text(tokenizer, out[0, len(prompt_ids):].tolist())
    _, side = steps.temperature_answers(sft_model, tokenizer, temp["question"], temp["temperatures"],
                                        temp["samples"], temp["max_new_tokens"], temp["seed"], device)
    answers = side["answers"]
    lowest, highest = (str(t) for t in (min(temp["temperatures"]), max(temp["temperatures"])))
    ps = [0.5, 0.9, 0.99]
    survivors = {
        name: {prefix: steps.top_p_survivors(steps.next_token_logits(model, tokenizer, prefix, device), ps)
               for prefix in (topp["prefix"], topp["sharp_prefix"])}
        for name, model in (("pretrain", pretrain), ("sft", sft_model))
    }
    figures = {
        "question": temp["question"],
        "expected_specialty": expect,
        "greedy_answer": greedy,
        "greedy_names_specialty": expect in greedy,
        "named": {t: sum(expect in a for a in texts) for t, texts in answers.items()},
        "distinct": {t: len(set(texts)) for t, texts in answers.items()},
        "samples": temp["samples"],
        "topp_pretrain": survivors["pretrain"],
        "topp_sft": survivors["sft"],
        "answers_example": {t: texts[:5] for t, texts in answers.items()},
    }
    checks = {
        "greedy_names_specialty": figures["greedy_names_specialty"],
        "named_at_lowest": figures["named"][lowest] >= BARS["named_at_lowest"],
        "distinct_at_highest": figures["distinct"][highest] >= BARS["distinct_at_highest"],
        "broad_prefix": survivors["pretrain"][topp["prefix"]]["0.9"] > BARS["broad_topp_0.9_more_than"],
        "sharp_prefix": survivors["pretrain"][topp["sharp_prefix"]]["0.9"] <= BARS["sharp_topp_0.9_at_most"],
    }
    return {**figures, "bars": BARS, "checks": checks, "ok": all(checks.values())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=ROOT / "config.yaml", type=Path, help="the lab's settings (lab.temp, lab.topp)")
    parser.add_argument("--models", default=ROOT / "results" / "default", type=Path,
                        help="folder with pretrain.pth, sft.pth and tokenizer/ (default: the embedded default's)")
    parser.add_argument("--expect", default=LAB_VILLAGE.specialty,
                        help="text a correct answer contains (default: the specialty of the lab question's village)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a tiny model: one thread is as fast, and never fights other jobs
    lab = yaml.safe_load(args.config.read_text(encoding="utf-8"))["lab"]
    tokenizer = load_tokenizer(args.models / "tokenizer")
    figures = measure(load_model(args.models / "pretrain.pth"), load_model(args.models / "sft.pth"), tokenizer, lab,
                      args.expect)
    print(json.dumps(figures, ensure_ascii=False, indent=2))
    if not figures["ok"]:
        failed = [name for name, ok in figures["checks"].items() if not ok]
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
