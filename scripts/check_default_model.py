"""Measure whether the embedded default models are good enough for the lab's lessons to show.

    python scripts/check_default_model.py --pretrain results/default/pretrain.pth \
        --sft results/default/sft.pth --tokenizer results/default/tokenizer

Prints the figures as JSON and exits 1 when a bar fails:
  * greedy SFT answer to the lab question names the village's specialty;
  * at temperature 0.3, at least 24 of 30 sampled answers name it;
  * at temperature 1.5, at least 20 of 30 sampled answers are distinct;
  * pretrained model, next token after [bos] + "민수는": top-p 0.9 keeps more than 10 tokens;
  * after [bos] + "가람 마을의 특산물은": top-p 0.9 keeps at most 3.
Sampling follows the lab exactly (kvlab.lab.steps): torch.manual_seed(seed) before each temperature.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from kvlab.lab import steps  # noqa: E402
from kvlab.engine.checkpoint import load_model  # noqa: E402
from kvlab.default_model.corpus import LAB_QUESTION, VILLAGE_BY_NAME  # noqa: E402
from kvlab.engine.tokenizer import load_tokenizer  # noqa: E402

BARS = {"named_at_0.3": 24, "distinct_at_1.5": 20, "broad_topp_0.9_more_than": 10, "sharp_topp_0.9_at_most": 3}


def measure(pretrain, sft_model, tokenizer, question: str, expect: str, broad_prefix: str, sharp_prefix: str,
            samples: int = 30, max_new_tokens: int = 24, seed: int = 0) -> dict:
    device = torch.device("cpu")
    chat = tokenizer.chat_text([{"role": "user", "content": question}], add_generation_prompt=True)
    prompt_ids = tokenizer.encode(chat)
    out = sft_model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             top_k=0, top_p=1.0, eos_token_id=tokenizer.eos_id)
    greedy = steps.answer_text(tokenizer, out[0, len(prompt_ids):].tolist())
    _, side = steps.temperature_answers(sft_model, tokenizer, question, [0.3, 1.0, 1.5], samples, max_new_tokens,
                                      seed, device)
    answers = side["answers"]
    ps = [0.5, 0.9, 0.99]
    broad = steps.top_p_survivors(steps.next_token_logits(pretrain, tokenizer, broad_prefix, device), ps)
    sharp = steps.top_p_survivors(steps.next_token_logits(pretrain, tokenizer, sharp_prefix, device), ps)
    sharp_sft = steps.top_p_survivors(steps.next_token_logits(sft_model, tokenizer, sharp_prefix, device), ps)
    broad_sft = steps.top_p_survivors(steps.next_token_logits(sft_model, tokenizer, broad_prefix, device), ps)
    figures = {
        "question": question,
        "expected_specialty": expect,
        "greedy_answer": greedy,
        "greedy_names_specialty": expect in greedy,
        "named": {t: sum(expect in a for a in texts) for t, texts in answers.items()},
        "distinct": {t: len(set(texts)) for t, texts in answers.items()},
        "samples": samples,
        "topp_pretrain": {broad_prefix: broad, sharp_prefix: sharp},
        "topp_sft": {broad_prefix: broad_sft, sharp_prefix: sharp_sft},
        "answers_example": {t: texts[:5] for t, texts in answers.items()},
    }
    checks = {
        "greedy_names_specialty": figures["greedy_names_specialty"],
        "named_at_0.3": figures["named"]["0.3"] >= BARS["named_at_0.3"],
        "distinct_at_1.5": figures["distinct"]["1.5"] >= BARS["distinct_at_1.5"],
        "broad_prefix": broad["0.9"] > BARS["broad_topp_0.9_more_than"],
        "sharp_prefix": sharp["0.9"] <= BARS["sharp_topp_0.9_at_most"],
    }
    figures["bars"] = BARS
    figures["checks"] = checks
    figures["ok"] = all(checks.values())
    return figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrain", required=True)
    parser.add_argument("--sft", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--question", default=LAB_QUESTION)
    parser.add_argument("--expect", default=VILLAGE_BY_NAME["가람"].specialty,
                        help="text a correct answer contains (default: 가람 마을's specialty)")
    parser.add_argument("--broad-prefix", default="민수는")
    parser.add_argument("--sharp-prefix", default="가람 마을의 특산물은")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a tiny model: one thread is as fast, and never fights other jobs
    tokenizer = load_tokenizer(args.tokenizer)
    pretrain = load_model(args.pretrain)
    sft_model = load_model(args.sft)
    figures = measure(pretrain, sft_model, tokenizer, args.question, args.expect, args.broad_prefix,
                      args.sharp_prefix, seed=args.seed)
    print(json.dumps(figures, ensure_ascii=False, indent=2))
    if not figures["ok"]:
        failed = [name for name, ok in figures["checks"].items() if not ok]
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
