"""The fast decode path: `generate(model, ids, ...)`, MiniMind's `generate` on a compiled step.

A cached decode step of the lab's model spends most of its time not on arithmetic but on the fixed
cost of some 400 operator calls (kvlab.measure.anatomy opens it), and a compiled step that cost's
remainder: the Python between it and the loop. This module drives the step of kvlab.engine.step
through the model's own generation loop (kvlab.engine.model.generation_loop), compiled, and keeps
MiniMind's tokens:

- **Ahead of time, on a CPU** (the default plan's `aot`): the step is exported and compiled by
  AOTInductor into a library kept on disk (kvlab.engine.aot), loaded once a process and called with
  no Python in between (5 µs a call, where a torch.compile'd function's entry costs 40-70 µs). Its
  cache length is symbolic: one program serves every generation, each cache exactly its generation's
  length, and every model of the architecture. The step also returns argmax(logits / temperature),
  MiniMind's next token when the knobs are plain greedy (kvlab.engine.sampling.is_greedy), so a
  greedy generation needs nothing else a step.
- **torch.compile** (the other plans, and a GPU's "reduce-overhead": CUDA graphs, the step replayed
  as one launch, its inputs at fixed addresses): compiled once per shape (`dynamic=False`), the cache
  length rounded up to a multiple of BUCKET_POSITIONS (never past max_position_embeddings) so that
  prompts of different lengths share it; the price is attention over up to BUCKET_POSITIONS - 1
  masked positions. Compiled code is made for torch's thread count too (one of its guards).

What stays eager, and why:

- **The prefill** (the prompt, fed once) runs the model's own eager modules into the same cache: its
  shape is the prompt's, and it is one call per generation. Its LM head runs on the last position
  alone (MiniMind computes every position's logits and reads the last).
- **A draw** (kvlab.engine.sampling, the one home of each rule): a compiled draw would take its
  random numbers from inductor's generator, not from the one `torch.manual_seed` seeds, so seeded
  samples would part from the eager path's.

A `Decoder` is kept per (model, batch, cache length or every length, dtype, device, plan). Its packed
weights are a copy of the model's, packed again at the start of a generation whenever a weight has
changed since (a tensor's version counter counts its in-place changes: a training step,
load_state_dict). Where no C++ compiler is found on a CPU (inductor writes C++ there), `generate` says
so in one line and runs the eager static path. A Decoder serves one generation at a time.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
import weakref

import torch

from kvlab.engine import aot, sampling
from kvlab.engine import model as model_module
from kvlab.engine.model import CausalLMOutput, MiniMindForCausalLM, StaticCache, generation_loop
from kvlab.engine import step as step_module
from kvlab.engine.step import (PADDED_KEY_SCORE, GreedyStep, PackedWeights, Shape, StepPlan, pack_layout,  # noqa: F401
                               packed_step_logits, shape_of, step_logits)
from kvlab.kernels import torch_internals
from kvlab.kernels.loader import find_cpp_compiler  # the C++ compiler inductor would use on a CPU, or None

# A torch.compile'd step serves every cache length up to its own; lengths are rounded up to this multiple.
BUCKET_POSITIONS = 256


def aot_program(model: MiniMindForCausalLM, batch: int, shape: Shape, plan: StepPlan) -> aot.Program:
    """The AOTInductor package of this architecture's step for `batch` rows (kvlab.engine.aot), its cache
    length symbolic: exported on an example cache of 97 positions (a length no other size shares)."""
    weight = model.lm_head.weight
    example = 97

    def export() -> torch.export.ExportedProgram:
        config = model.config
        kv_heads, head_dim = config.num_key_value_heads, config.head_dim
        keys = [torch.zeros(batch, kv_heads, head_dim, example, dtype=weight.dtype) for _ in range(shape.layers)]
        values = [torch.zeros(batch, kv_heads, example, head_dim, dtype=weight.dtype) for _ in range(shape.layers)]
        packed = torch.zeros(sum(math.prod(size) for _, size in pack_layout(shape, plan)), dtype=weight.dtype)
        inputs = (torch.zeros(batch, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                  torch.zeros(batch, example), torch.tensor(1.0), packed, *keys, *values)
        length = torch.export.Dim("cache_length", min=2, max=max(3, shape.positions))
        cache = (*[{3: length}] * shape.layers, *[{2: length}] * shape.layers)  # the varargs, as one tuple
        dynamic = (None, None, {1: length}, None, None, cache)
        return torch.export.export(GreedyStep(shape, plan), inputs, dynamic_shapes=dynamic)

    # the thread count too: inductor writes its parallel loops for the count it compiles with
    parts = ("decode step", tuple(shape), dataclasses.astuple(plan), batch, str(weight.dtype), torch.get_num_threads())
    return aot.program(parts, (step_module, model_module), export)


# --- the compiled step -----------------------------------------------------------------------------


_COMPILED: dict[tuple, object] = {}


def compiled_step(mode: str, cpp_wrapper: bool):
    """`packed_step_logits` compiled for `mode`, one wrapper per mode for the whole process: its
    compiled code is keyed by the inputs' shapes, dtypes and devices (and the plan's and Shape's
    values), so every Decoder with the same shapes shares it."""
    key = (mode, cpp_wrapper)
    if key not in _COMPILED:
        how = {"options": {"cpp_wrapper": True}} if cpp_wrapper else {"mode": mode}
        _COMPILED[key] = torch.compile(packed_step_logits, dynamic=False, fullgraph=True, **how)
    return _COMPILED[key]


# --- the decoder: a cache, its weights and its step, per shape --------------------------------------


def bucket_length(needed: int, limit: int) -> int:
    """The cache length for a generation that needs `needed` positions: rounded up to a multiple
    of BUCKET_POSITIONS, at most `limit` (the model's max_position_embeddings)."""
    return min(-(-needed // BUCKET_POSITIONS) * BUCKET_POSITIONS, limit)


class DecodeCache(StaticCache):
    """A StaticCache laid out for a one-token query: per layer the keys stored transposed,
    (B, KV, D, L), and the values (B, KV, L, D), so that both of attention's products read the cache
    as it lies (MiniMind's (B, L, KV, D) would be copied to a new layout first). `keys` and `values`
    are (B, L, KV, D) views of them, as the model's eager forward (the prefill) writes a StaticCache.
    One tensor per layer, not one for all: the compiled step writes a whole input in place, where
    it would copy a tensor to write into a view of it."""

    def __init__(self, config, batch: int, max_tokens: int, dtype, device):
        kv_heads, head_dim, layers = config.num_key_value_heads, config.head_dim, config.num_hidden_layers
        self.keys_t = [torch.zeros(batch, kv_heads, head_dim, max_tokens, dtype=dtype, device=device)
                       for _ in range(layers)]
        self.head_major_values = [torch.zeros(batch, kv_heads, max_tokens, head_dim, dtype=dtype, device=device)
                                  for _ in range(layers)]
        self.keys = [layer.permute(0, 3, 1, 2) for layer in self.keys_t]
        self.values = [layer.transpose(1, 2) for layer in self.head_major_values]
        self.max_tokens = max_tokens
        self.length = 0


class Decoder:
    """Everything one shape of generation needs, made once and reused by every generation of that
    shape: the packed weights, the position, token and padding inputs, the step, and the cache (with
    a cache length fixed by the shape, or, for an `aot` plan, made for each generation's own length).
    It holds its model weakly (the model's Decoders go with the model).

    `compile_s` is the wall time of compiling (or loading) the step, kept apart from every timing: an
    `aot` plan's when the Decoder is made, else the first compiled step's (compiling, or finding the
    compiled code when another Decoder of the same shapes compiled it); `steps` counts the decode
    steps run."""

    def __init__(self, model: MiniMindForCausalLM, batch: int, cache_length: int | None, plan: StepPlan):
        self._model = weakref.ref(model)
        self.batch, self.cache_length, self.plan = batch, cache_length, plan
        self.compile_s: float | None = None
        self.steps = 0
        weight = model.lm_head.weight
        self.dtype, self.device = weight.dtype, weight.device
        self.shape = shape_of(model, cache_length or model.config.max_position_embeddings)
        self.weights = PackedWeights(model, self.shape, plan)
        self.cache: DecodeCache | None = None
        self.padding_bias: torch.Tensor | None = None
        self.token_ids = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)
        self.temperature = torch.ones((), device=self.device)
        self._temperature = 1.0  # what `temperature` holds (read without a tensor access)
        self.program = aot_program(model, batch, self.shape, plan) if plan.aot else None
        if self.program is not None:
            self.compile_s = self.program.compile_s
        self.step_fn = None if plan.compile_mode is None or plan.aot else compiled_step(plan.compile_mode,
                                                                                           plan.cpp_wrapper)
        if cache_length is not None:
            self._allocate(cache_length)

    def _allocate(self, length: int) -> None:
        """A cache and a padding bias of `length` positions (CUDA graphs replay them at fixed addresses)."""
        self.cache = DecodeCache(self.model.config, self.batch, length, self.dtype, self.device)
        self.padding_bias = torch.zeros(self.batch, length, dtype=torch.float32, device=self.device)
        if self.step_fn is not None and self.device.type == "cuda":
            for tensor in self.step_tensors():
                torch_internals.mark_static_address(tensor)

    def step_inputs(self) -> tuple:
        """What the compiled step reads, in its order: four tensors, then per layer K and V."""
        return (self.token_ids, self.position, self.padding_bias, self.weights.packed, self.cache.keys_t,
                self.cache.head_major_values)

    def step_tensors(self) -> list[torch.Tensor]:
        """Every tensor of `step_inputs`."""
        return [*self.step_inputs()[:4], *self.cache.keys_t, *self.cache.head_major_values]

    @property
    def model(self) -> MiniMindForCausalLM:
        return self._model()

    def start(self, attention_mask: torch.Tensor | None, needed: int) -> DecodeCache:
        """Make the decoder ready for a new generation of `needed` positions: the cache empty (made anew
        when an `aot` plan's length changes), the weights packed if they changed, the prompt's padding
        (attention_mask (B, P), 0 at padding) in the padding bias."""
        if self.cache_length is None and (self.cache is None or self.cache.max_tokens != needed):
            self._allocate(needed)
        self.cache.length = 0
        self.weights.refresh()
        self.padding_bias.zero_()
        if attention_mask is not None:
            self.padding_bias[:, : attention_mask.shape[1]] = (1.0 - attention_mask.float()) * PADDED_KEY_SCORE
        return self.cache

    def decode_step(self, input_ids, attention_mask, past_key_values, use_cache: bool, **knobs):
        """`MiniMindForCausalLM.decode_step`'s contract: the prompt goes through the model's eager modules
        (into this decoder's cache); each later token through the static-shape step. Then the next
        ids (kvlab.engine.sampling.pick: an `aot` step's own greedy choice, or the eager
        choice). Returns (outputs, (B, 1) ids)."""
        greedy = None
        if self.cache.length == 0:
            logits = self._prefill(input_ids, attention_mask)
        else:
            self.position.fill_(self.cache.length)
            self.token_ids.copy_(input_ids[:, -1:])  # a view of input_ids has a new stride each step
            logits, greedy = self.run_step(knobs["temperature"])
            self.cache.length += 1
        next_token = sampling.pick(logits, input_ids, **knobs, greedy=greedy)
        return CausalLMOutput(logits=logits[:, None, :], past_key_values=self.cache), next_token

    def _prefill(self, input_ids, attention_mask) -> torch.Tensor:
        """The prompt through the model's own eager modules into the cache; the last position's logits.
        The LM head runs on that position alone (MiniMind computes every position's logits and reads
        the last: a seventh of a prompt's arithmetic on the lab's model, for logits some 1e-6 apart,
        another library kernel's roundings)."""
        model = self.model
        hidden, _ = model.model(input_ids, attention_mask, self.cache, use_cache=True)
        return model.lm_head(hidden[:, -1, :])

    def run_step(self, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One decode step of `token_ids` at `position`: (B, V) logits, K and V written into the cache;
        and, from an `aot` step, its greedy choice at `temperature` (else None)."""
        greedy = None
        if self.program is not None:
            if self._temperature != temperature:
                self.temperature.fill_(temperature)
                self._temperature = temperature
            logits, greedy = self.program.run([self.token_ids, self.position, self.padding_bias, self.temperature,
                                               self.weights.packed, *self.cache.keys_t, *self.cache.head_major_values])
        elif self.step_fn is None:
            logits = step_logits(self.token_ids, self.position, self.padding_bias, self.weights.views, self.cache.keys_t,
                                 self.cache.head_major_values, self.shape, self.plan)
        else:
            logits = self._compiled_step()
        self.steps += 1
        return logits, greedy

    def _compiled_step(self) -> torch.Tensor:
        """The compiled step; the first one's wall time (its compiling) kept as compile_s."""
        on_gpu = self.token_ids.device.type == "cuda"
        if on_gpu:
            torch.compiler.cudagraph_mark_step_begin()  # a new replay: the last step's outputs may be reused
        start = time.perf_counter()
        logits = self.step_fn(*self.step_inputs(), self.shape, self.plan)
        if self.steps == 0:
            if on_gpu:
                torch.cuda.synchronize()
            self.compile_s = time.perf_counter() - start
        return logits


_DECODERS: "weakref.WeakKeyDictionary[MiniMindForCausalLM, dict]" = weakref.WeakKeyDictionary()


def decoders_of(model: MiniMindForCausalLM) -> dict:
    """The model's Decoders, keyed by (batch, cache length (None: every length), dtype, device, plan)."""
    return _DECODERS.setdefault(model, {})


def decoder_for(model: MiniMindForCausalLM, batch: int, needed: int, plan: StepPlan) -> Decoder:
    """The Decoder of this shape, made on first use. `needed`: the positions the generation fills; an
    `aot` plan's Decoder serves every length, another's the lengths of its bucket."""
    weight = model.lm_head.weight
    length = None if plan.aot else bucket_length(needed, model.config.max_position_embeddings)
    key = (batch, length, weight.dtype, weight.device, plan)
    found = decoders_of(model)
    if key not in found:
        found[key] = Decoder(model, batch, length, plan)
    return found[key]


def default_plan(device) -> StepPlan:
    """What `generate` runs by default: every fusion, compiled. On a CPU the matrix products are
    written row by row, so that inductor fuses the whole step into its own C++ loops, compiled ahead
    of time (`aot`: no Python between the step and the loop, a cache exactly the generation's length,
    the greedy choice inside); on a GPU, cuBLAS's products and CUDA graphs (mode "reduce-overhead":
    the step replayed as one launch)."""
    if torch.device(device).type == "cuda":
        return StepPlan(compile_mode="reduce-overhead")
    return StepPlan(rowwise_matmul=True, aot=True)


NO_COMPILER = ("kvlab.engine.fast.generate: no C++ compiler found (torch.compile needs one on a CPU; "
               "install g++ or set CXX), so this generation runs the eager static path")


def decoding(model: MiniMindForCausalLM, input_ids: torch.Tensor, attention_mask, needed: int,
             plan: StepPlan | None = None):
    """(step, cache) for `generate`: a Decoder's step and its emptied cache; with no C++ compiler on a
    CPU, one warning and the eager static path's (the model's own step over a StaticCache)."""
    device = input_ids.device
    plan = plan or default_plan(device)
    if plan.compile_mode is not None and device.type == "cpu" and find_cpp_compiler() is None:
        warnings.warn(NO_COMPILER, RuntimeWarning, stacklevel=3)
        cache = StaticCache(model.config, input_ids.shape[0], needed, model.lm_head.weight.dtype, device)
        return model.decode_step, cache
    decoder = decoder_for(model, input_ids.shape[0], needed, plan)
    return decoder.decode_step, decoder.start(attention_mask, needed)


@torch.inference_mode()
def generate(model: MiniMindForCausalLM, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None,
             max_new_tokens: int = 8192, temperature: float = 0.85, top_p: float = 0.85, top_k: int = 50,
             eos_token_id: int | None = 2, num_return_sequences: int = 1, do_sample: bool = True,
             repetition_penalty: float = 1.0, *, plan: StepPlan | None = None) -> torch.Tensor:
    """MiniMind's `generate` (the model's knobs, its loop: kvlab.engine.model.generation_loop), each
    decode step one call of a compiled step of static shapes (`plan`: default_plan's, or another, to
    measure one fusion, or the fused step uncompiled). The same tokens as `model.generate`, fewer and
    fused operator calls. Returns prompt + new ids, (B * num_return_sequences, P + n)."""
    input_ids, attention_mask = model.generation_inputs(inputs, attention_mask, max_new_tokens, num_return_sequences,
                                                        temperature, do_sample)
    step, cache = decoding(model, input_ids, attention_mask, inputs.shape[1] + max_new_tokens - 1, plan)
    knobs = dict(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty,
                 do_sample=do_sample)
    return generation_loop(step, input_ids, attention_mask, cache, max_new_tokens, eos_token_id, True, knobs)
