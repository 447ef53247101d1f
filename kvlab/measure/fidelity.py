"""kvlab's engine held against the user's own MiniMind code (`minimind_src`), on the lab's checkpoints.

For each checkpoint, MiniMind's model is built from the file's own config class with the
architecture kvlab inferred (every field kvlab.engine.architecture read off the tensors, was told in
`model_overrides` or measured); the fields kvlab took from its layout defaults (eps, RoPE base, ...)
are left to the file's own defaults, so an assumption of kvlab's that the file does not share shows
up as a difference. The same state_dict is loaded strictly, and both models, in float32 on
the same device, run the lab's own prompts and settings:

- logits on step 1's prompt, and the KV cache after it (shapes and values);
- greedy tokens with and without the cache (step 1's setting);
- seeded sampled tokens at step 5's temperatures, every row (step 5's setting);
- top-p survivors after step 6's prefixes: kvlab's count by its one rule (step 6's own function),
  MiniMind's as the number of tokens its `generate` gives a probability above zero when it samples.

Each check says `identical` (bit for bit), or where the two first part and the values there.
The prompts and generation settings are kvlab.measure.steps' functions, called on both models.
"""

from __future__ import annotations

import logging
import math
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from itertools import zip_longest

import torch

from kvlab.engine.checkpoint import CheckpointError, check_keys_and_shapes, read_state_dict
from kvlab.engine.tokenizer import Tokenizer
from kvlab.measure import steps
from kvlab.facts.formulas import MODES
from kvlab.measure.minimind_src import MODULE_NAME, MiniMindSourceError, load_source
from kvlab.facts.tokens import first_difference

log = logging.getLogger("kvlab")

# Architecture sources (kvlab.engine.architecture) whose values MiniMind's config is given; the
# rest ("layout default") is left to the file's own defaults.
PASSED_SOURCES = ("file", "user", "measured")
LOGIT_AXES = ("row", "position", "token_id")
CACHE_AXES = ("row", "position", "kv_head", "dim")


@dataclass
class LabSettings:
    """The lab's own inputs and knobs that the checks reuse."""

    prompt_ids: list[int]  # step 1's prompt (results/prompt.json)
    new_tokens: int  # step 1
    question: str  # step 5
    temperatures: list[float]
    samples: int
    max_new_tokens: int
    seed: int
    prefixes: list[str]  # step 6: the flat and the sharp prefix
    ps: list[float]


# --- building MiniMind's model -------------------------------------------------------------------


def build_minimind(config_class, model_class, kvlab_model, overrides: dict, source) -> tuple[torch.nn.Module, dict]:
    """MiniMind's model from its own config class with the architecture kvlab inferred for
    `kvlab_model`; returns (model, the keyword arguments given to the config class).
    q/k norms are not given: whether they exist is the file's version, not a config key."""
    config = kvlab_model.config.to_dict()
    passed = {key: config[key] for key, origin in kvlab_model.architecture.sources.items()
              if origin in PASSED_SOURCES and key != "qk_norm"}
    passed |= dict(overrides)
    try:
        model = model_class(config_class(**passed))
    except Exception as err:
        raise MiniMindSourceError(
            f"{source}: MiniMindConfig/MiniMindForCausalLM refused the architecture {passed}: "
            f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        ) from None
    return model, passed


def load_checkpoint_into(model: torch.nn.Module, checkpoint, source) -> None:
    """Load the checkpoint into MiniMind's model strictly, refusing in one line a model that cannot hold it."""
    try:
        state_dict = check_keys_and_shapes(checkpoint, model, read_state_dict(checkpoint))
    except CheckpointError as err:
        raise MiniMindSourceError(f"{source}: the MiniMindForCausalLM it builds cannot hold the checkpoint {err}") from None
    model.load_state_dict(state_dict, strict=True)


def describe_source(model: torch.nn.Module, source) -> dict:
    """Which MiniMind the file is: q/k norms or not, and whose `generate` it runs."""
    qk_norm = any(".q_norm." in key for key in model.state_dict())
    owner = next(cls for cls in type(model).__mro__ if "generate" in vars(cls))
    module = str(source) if owner.__module__ == MODULE_NAME else owner.__module__
    # the transformers the file builds on, if it does: a base class of the model from it (MiniMind's
    # PreTrainedModel, GenerationMixin), not whatever else this process imported
    uses = any(cls.__module__.split(".")[0] == "transformers" for cls in type(model).__mro__)
    transformers = sys.modules.get("transformers") if uses else None
    return {
        "path": str(source),
        "qk_norm": qk_norm,
        "layout": "minimind-3 (q_norm/k_norm)" if qk_norm else "MiniMind2 (no q_norm/k_norm)",
        "generate": f"{module}: {owner.__qualname__}.generate",
        "generate_in_file": owner.__module__ == MODULE_NAME,
        "transformers": getattr(transformers, "__version__", None),
    }


def config_differences(kvlab_config, minimind_model, qk_norm: bool) -> dict:
    """Every field of kvlab's config that MiniMind's config also holds, where the two disagree
    (q/k norms: whether MiniMind's model has them)."""
    theirs_config = minimind_model.config
    differences = {}
    for key, ours in kvlab_config.to_dict().items():
        if key == "qk_norm":
            theirs = qk_norm
        elif hasattr(theirs_config, key):
            theirs = getattr(theirs_config, key)
        else:
            continue
        if theirs != ours:
            differences[key] = {"kvlab": ours, "minimind": theirs if _json_scalar(theirs) else repr(theirs)}
    return differences


def _json_scalar(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


# --- comparing -----------------------------------------------------------------------------------


def tensor_difference(ours: torch.Tensor, theirs: torch.Tensor, axes: tuple[str, ...]) -> dict:
    """`identical` (bit for bit), the shape, the largest absolute difference and, when they differ,
    the first differing element (named by `axes`) with both values."""
    ours, theirs = ours.detach().float().cpu(), theirs.detach().float().cpu()
    if ours.shape != theirs.shape:
        return {"identical": False, "shape": {"kvlab": list(ours.shape), "minimind": list(theirs.shape)}}
    result = {"identical": bool(torch.equal(ours, theirs)), "shape": list(ours.shape),
              "max_abs_diff": float((ours - theirs).abs().max()) if ours.numel() else 0.0}
    if not result["identical"]:
        index = (ours != theirs).nonzero()[0].tolist()
        result["first_difference"] = {**dict(zip(axes, index)), "kvlab": float(ours[tuple(index)]),
                                      "minimind": float(theirs[tuple(index)])}
    return result


def legacy_cache(past_key_values) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """MiniMind's cache as a list of (k, v) per layer (a transformers Cache object is converted)."""
    if hasattr(past_key_values, "to_legacy_cache"):
        past_key_values = past_key_values.to_legacy_cache()
    if not isinstance(past_key_values, (list, tuple)):
        raise MiniMindSourceError(f"MiniMind's forward returned past_key_values of type {type(past_key_values).__name__}, "
                                  "expected a (k, v) pair per layer")
    return [tuple(pair) for pair in past_key_values]


def cache_difference(ours, theirs) -> dict:
    """Both caches layer by layer, K then V: `identical`, kvlab's K and V shapes, whether MiniMind's
    have the same, the largest absolute difference, and the first differing element."""
    theirs = legacy_cache(theirs)
    result = {"identical": len(ours) == len(theirs), "layers": {"kvlab": len(ours), "minimind": len(theirs)},
              "k_shape": list(ours[0][0].shape), "v_shape": list(ours[0][1].shape), "shapes_identical": True,
              "max_abs_diff": 0.0}
    for layer, (pair_ours, pair_theirs) in enumerate(zip(ours, theirs)):
        for name, mine, other in zip(("k", "v"), pair_ours, pair_theirs):
            diff = tensor_difference(mine, other, CACHE_AXES)
            if "max_abs_diff" in diff:
                result["max_abs_diff"] = max(result["max_abs_diff"], diff["max_abs_diff"])
            else:
                result["shapes_identical"] = False
                result["max_abs_diff"] = math.inf
            if not diff["identical"] and result["identical"]:
                result["identical"] = False
                where = diff.get("first_difference") or {"shape": diff["shape"]}
                result["first_difference"] = {"layer": layer, "tensor": name, **where}
    if math.isinf(result["max_abs_diff"]):
        result["max_abs_diff"] = None  # some shapes differ: no elementwise difference
    return result


def token_difference(ours: list[list[int]], theirs: list[list[int]]) -> dict:
    """Token rows compared: `identical`, and the first differing row and position (counted from the
    first new token) with both tokens (null where a row has already ended)."""
    result = {"identical": ours == theirs, "rows": len(ours), "new_tokens": max((len(row) for row in ours), default=0)}
    for row, (mine, other) in enumerate(zip_longest(ours, theirs, fillvalue=[])):
        if mine != other:
            position = first_difference(mine, other)
            result["first_difference"] = {"row": row, "position": position,
                                          "kvlab": mine[position] if position < len(mine) else None,
                                          "minimind": other[position] if position < len(other) else None}
            break
    return result


@contextmanager
def watching_multinomial():
    """Record the probabilities of every `torch.multinomial` call: what a `generate` samples from."""
    drawn_from = []
    original = torch.multinomial

    def multinomial(probabilities, *args, **kwargs):
        drawn_from.append(probabilities.detach())
        return original(probabilities, *args, **kwargs)

    torch.multinomial = multinomial
    try:
        yield drawn_from
    finally:
        torch.multinomial = original


def survivors_in_generate(model, ids: torch.Tensor, p: float) -> int | None:
    """How many tokens `model.generate` keeps at top-p = p (temperature 1, top-k off): the nonzero
    probabilities of its one sampling step. None if it drew through no `torch.multinomial`."""
    with watching_multinomial() as drawn_from:
        model.generate(ids, max_new_tokens=1, do_sample=True, temperature=1.0, top_k=0, top_p=p, eos_token_id=None)
    return int((drawn_from[0][0] > 0).sum()) if drawn_from else None


def survivors_difference(ours: dict, theirs: dict) -> dict:
    result = {"identical": ours == theirs, "kvlab": ours, "minimind": theirs}
    for p in ours:
        if ours[p] != theirs.get(p):
            result["first_difference"] = {"p": p, "kvlab": ours[p], "minimind": theirs.get(p)}
            break
    return result


def compare_checkpoint(kvlab_model, minimind_model, tokenizer: Tokenizer, settings: LabSettings, device) -> dict:
    """Every check on one checkpoint, each keyed by its name (sampled and top-p by temperature and prefix)."""
    checks = {}
    prompt = steps.prompt_tensor(kvlab_model, settings.prompt_ids, settings.new_tokens, device)
    with torch.inference_mode():
        ours = kvlab_model(prompt, use_cache=True)
        theirs = minimind_model(input_ids=prompt, use_cache=True)
    checks["logits"] = tensor_difference(ours.logits, theirs.logits, LOGIT_AXES)
    checks["kv_cache"] = cache_difference(ours.past_key_values, theirs.past_key_values)
    for label, use_cache in MODES:
        checks[f"greedy_{label}"] = token_difference(
            [steps.greedy_new_ids(kvlab_model, prompt, settings.new_tokens, use_cache)],
            [steps.greedy_new_ids(minimind_model, prompt, settings.new_tokens, use_cache)])
    _, chat_ids = steps.chat_prompt(tokenizer, settings.question)
    chat = steps.prompt_tensor(kvlab_model, chat_ids, settings.max_new_tokens, device)
    checks["sampled"] = {}
    for temperature in settings.temperatures:
        rows = [steps.sampled_new_ids(model, chat, temperature, settings.samples, settings.max_new_tokens,
                                      settings.seed, tokenizer.eos_id).tolist()
                for model in (kvlab_model, minimind_model)]
        checks["sampled"][str(temperature)] = token_difference(*rows)
    checks["topp"] = {}
    for prefix in settings.prefixes:
        ours = steps.top_p_survivors(steps.next_token_logits(kvlab_model, tokenizer, prefix, device), settings.ps)
        ids = torch.tensor([steps.prefix_ids(tokenizer, prefix)], device=device)
        theirs = {str(p): survivors_in_generate(minimind_model, ids, p) for p in settings.ps}
        checks["topp"][prefix] = survivors_difference(ours, theirs)
    return checks


def leaf_checks(checks: dict, prefix: str = "") -> list[tuple[str, dict]]:
    """(name, check) for every check, nested ones named "sampled 0.3", "topp 민수는"."""
    leaves = []
    for name, check in checks.items():
        if "identical" in check:
            leaves.append((f"{prefix}{name}", check))
        else:
            leaves.extend(leaf_checks(check, f"{prefix}{name} "))
    return leaves


def describe_difference(name: str, check: dict) -> str:
    where = check.get("first_difference", {})
    return f"{name}: " + ", ".join(f"{key}={value}" for key, value in where.items())


def hold_against_minimind(source, checkpoints: dict, tokenizer: Tokenizer, settings: LabSettings, device,
                          overrides: dict) -> dict:
    """fidelity.json: MiniMind's file at `source` against kvlab's engine on each checkpoint.

    checkpoints: {name: (path, kvlab's model of it, loaded by kvlab.engine.checkpoint.load_model in
    float32 on `device`)}."""
    config_class, model_class = load_source(source)
    recorded_settings = asdict(settings)
    recorded_settings["prompt_len"] = len(recorded_settings.pop("prompt_ids"))
    result = {"identical": True, "checks": 0, "differences": [], "minimind": None,
              "model_overrides": dict(overrides),
              "settings": {**recorded_settings, "dtype": "float32", "device": str(device)},
              "checkpoints": {}}
    for name, (path, kvlab_model) in checkpoints.items():
        minimind_model, passed = build_minimind(config_class, model_class, kvlab_model, overrides, source)
        load_checkpoint_into(minimind_model, path, source)
        minimind_model = minimind_model.to(device=device, dtype=torch.float32).eval()
        described = describe_source(minimind_model, source)
        result["minimind"] = result["minimind"] or described
        log.info("%s: %s, generate from %s", name, described["layout"], described["generate"])
        checks = compare_checkpoint(kvlab_model, minimind_model, tokenizer, settings, device)
        leaves = leaf_checks(checks)
        differing = [describe_difference(f"{name} {check_name}", check) for check_name, check in leaves
                     if not check["identical"]]
        for line in differing:
            log.info("differs: %s", line)
        log.info("%s: %d of %d checks identical", name, len(leaves) - len(differing), len(leaves))
        result["checkpoints"][name] = {
            "path": str(path),
            "kvlab_assumed": {"layout": kvlab_model.architecture.layout, "config": kvlab_model.config.to_dict(),
                              "sources": dict(kvlab_model.architecture.sources)},
            "passed_to_minimind_config": passed,
            "config_differences": config_differences(kvlab_model.config, minimind_model, described["qk_norm"]),
            "identical": not differing,
            "checks": checks,
        }
        result["checks"] += len(leaves)
        result["differences"] += differing
        del minimind_model
    result["identical"] = not result["differences"]
    return result
