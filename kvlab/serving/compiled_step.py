"""A serving step in one compiled call: every position every scheduled request feeds (prompt chunks
and decode rows alike), whatever its request, position or block table, through one compiled function
over the block pool.

A step's rows differ in everything a compiled graph would specialise on: how many there are, how long
each row's context is, which blocks hold it. vLLM captures one CUDA graph per batch size and pads the
rows up to it, because a graph replays fixed shapes. On a CPU there is no such limit: the step here
is exported once with its sizes symbolic (`torch.export` Dims: the rows, the (row, block) pairs of the
attention, the rows that want logits, the pool's blocks) and compiled by AOTInductor, so one compiled
step serves every step of every run on the same architecture, with no padding to a bucket and no
recompilation (docs/serving.md: measured against one graph per batch size). Sizes 0 and 1 are special
to the exporter (it would specialise on them): a step of one row gets a second that writes the pool's
scratch block (kvlab.serving.block_pool), and one that wants one row's logits computes a second's.

Inside (`step_logits`): the packed weights (kvlab.engine.step.PackedWeights: q/k/v and gate/up each
one product), each row's token at its own position (RoPE rows gathered per row), its K and V written
into its slot of the pool, attention over the blocks its table holds (on a CPU in float32,
`kvlab::paged_attention`, kvlab.kernels' C++ operator, called from the graph as a custom operator;
elsewhere kvlab.serving.paged_attention.block_attention, the same in torch: either way the work follows
the (row, block) pairs, so a row reads its own blocks and no padding), the MLP, and the LM head over the
rows that draw. Each product with the weights is one for all the step's rows: with the C++ operators,
`kvlab::linear` (a product of its own on the weight laid out in panels, PackedWeights.panels, from 4
rows on; MKL's below);
elsewhere the BLAS library's. Each drawing row's greedy pick, argmax(logits / temperature), is made in
the step too, as the fast path's step makes it (on a CPU `kvlab::greedy_pick`, kvlab.kernels);
every other choice stays eager (kvlab.engine.sampling).

What it gives up: bits. `generate` alone computes its products over other row counts and its
attention in another order, so the logits differ in their last bits (some 1e-6) and a token can
differ only where two candidates are that close; the engine's tests and the trace rule count such
requests against `generate` alone (kvlab.serving.alone) instead of assuming there are none (the eager
way, `ServingConfig(compile=False)`, gives `generate`'s bits). Where no C++ compiler is found
(inductor writes C++ on a CPU), the same function runs eagerly and says so once.

Compiled once, kept: the first call of an architecture in a process asks kvlab.engine.aot for the
step compiled ahead of time (`PackedStep` exported on example inputs whose sizes no two share, its
sizes symbolic as above; the custom operators traced through their fakes, kvlab.kernels.ops), kept on
disk under a key of what the compiled code depends on (`CompiledStep.key`: the architecture's numbers,
the pool's and weights' shapes and dtypes; torch's version, the thread count, the CPU, the C++
kernels' library and the source of the modules traced). A process that finds it loads it (a second or
two) instead of compiling (some 25 s for the lab's model, more for the C++ kernels the first time);
every step then calls the package's library on the flat list of its tensors: no Python between, no
guards (what they would check is the key), as the single-request path's step (kvlab.engine.fast). The
same way as `torch.compile(...).aot_compile` before it, measured side by side in one process (the
lab's model, one thread): a step of 2 rows 0.40 against 0.54 ms, 8 rows 0.83 against 0.98 ms, 64 rows
at 160 positions 9.4 against 9.7 ms, the same picks; it compiles in some 26 s against 18 s, once.
"""

from __future__ import annotations

import os
import sys
import warnings
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from kvlab.engine import aot, sampling, step
from kvlab.engine import model as model_module
from kvlab.engine.model import MiniMindForCausalLM, rms_norm
from kvlab.kernels import loader, ops
from kvlab.serving.block_pool import BlockPool
from kvlab.serving.paged_attention import block_attention

# The step's plan: every fusion, the weight products by the BLAS library (a batch of rows).
PLAN = step.StepPlan(fused_qkv=True, fused_gate_up=True, attention="grouped", compile_mode="default",
                     cpp_wrapper=True, rowwise_matmul=False)
MIN_SIZE = 2  # dynamo compiles sizes 0 and 1 apart: every symbolic size is padded to 2
NO_COMPILER = ("ServingConfig.compile: no C++ compiler found (torch.compile needs one on a CPU; install g++ or "
               "set CXX), so the serving engine's steps run the same step eagerly")


@dataclass
class StepRows:
    """A step's rows as the compiled step reads them, in four tensors: `per_row` (3, N), each row's
    `token_ids`, `positions` and `slots` (block x block_size + offset, where its K and V go);
    `per_pair` (3, P), each (row, block) pair's `pair_rows`, `pair_blocks` and `pair_starts`;
    `logit_rows` (R), the rows whose logits are wanted, and `temperatures` (R), each one's temperature
    for its greedy pick (1 where it is not plain greedy). Stacked so that the compiled step has one
    symbolic size for N and one for P: each size is read from its tensor and handed to the compiled
    code on every call (with the pool's sizes said equal, 5 sizes instead of 14: a two-row step's call
    443 -> 388 µs; the temperatures' one more)."""

    per_row: torch.Tensor
    per_pair: torch.Tensor
    logit_rows: torch.Tensor
    temperatures: torch.Tensor

    token_ids = property(lambda self: self.per_row[0])
    positions = property(lambda self: self.per_row[1])
    slots = property(lambda self: self.per_row[2])
    pair_rows = property(lambda self: self.per_pair[0])
    pair_blocks = property(lambda self: self.per_pair[1])
    pair_starts = property(lambda self: self.per_pair[2])

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(tensor for tensor, _ in self.symbolic())

    def symbolic(self) -> tuple[tuple[torch.Tensor, int], ...]:
        """Each tensor with its symbolic (row or pair) dimension."""
        return (self.per_row, 1), (self.per_pair, 1), (self.logit_rows, 0), (self.temperatures, 0)


def ragged(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For groups of `counts` items laid end to end: each item's group and its index within it."""
    group = np.repeat(np.arange(len(counts)), counts)
    return group, np.arange(len(group)) - (np.cumsum(counts) - counts)[group]


class RowInput(NamedTuple):
    """What one row of a piece (kvlab.serving.request.Piece, kvlab.serving.runner.PieceInput) feeds the
    step: its token ids at positions start, start + 1, ..., the blocks of its table, and whether its
    last logits are wanted (a draw follows)."""

    token_ids: list[int]
    start: int
    block_table: list[int]
    wants_logits: bool


def step_rows(pieces: list[RowInput], block_size: int, scratch_block: int,
              device, temperatures: list[float] | None = None, dtype: torch.dtype = torch.float32) -> StepRows:
    """The rows of a step's pieces (a RowInput each): one row
    per position a piece feeds, at start, start + 1, ...; every row reads the blocks of its table up to
    its own position; `temperatures`, one per piece that wants logits (else 1), in `dtype`, the
    logits'. A step of one row gets a second on the scratch block; a step that wants one row's
    logits (or none) gets the last row's again (MIN_SIZE). Built with NumPy from the pieces' lists laid
    end to end (each table once, however many rows read it): a step's thousand small integers cost
    less there than in a dozen tensor calls or a padded table."""
    token_ids, starts, lengths, tables, logit_rows = [], [], [], [], []
    for ids, start, table, wants_logits in pieces:
        token_ids += ids
        starts.append(start)
        lengths.append(len(ids))
        tables += table
        if wants_logits:
            logit_rows.append(len(token_ids) - 1)
    table_lengths = [len(table) for _, _, table, _ in pieces]
    if len(token_ids) < MIN_SIZE:
        token_ids.append(0)
        starts.append(0)
        lengths.append(1)
        tables.append(scratch_block)
        table_lengths.append(1)
    temperatures = list(temperatures) if temperatures is not None else [1.0] * len(logit_rows)
    temperatures += [1.0] * max(0, MIN_SIZE - len(logit_rows))
    logit_rows += [len(token_ids) - 1] * max(0, MIN_SIZE - len(logit_rows))
    table_lengths = np.array(table_lengths, dtype=np.int64)
    table_start = np.cumsum(table_lengths) - table_lengths  # where each piece's table begins in `tables`
    count = len(token_ids)
    if count == len(starts):  # a row per piece (decoding): each row at its piece's start
        at, row_table = np.array(starts, dtype=np.int64), table_start
    else:
        owner, offset = ragged(np.array(lengths, dtype=np.int64))  # each row's piece, and its place in it
        at, row_table = np.array(starts, dtype=np.int64)[owner] + offset, table_start[owner]  # its position, table
    reads = at // block_size + 1  # the blocks a row reads: its table's first `reads`
    tables = np.array(tables, dtype=np.int64)
    per_row = np.empty((3, count), dtype=np.int64)
    per_row[0], per_row[1] = token_ids, at
    per_row[2] = tables[row_table + reads - 1] * block_size + at % block_size
    if count == len(starts) and len(tables) == reads.sum():  # decoding, each table just the blocks read: the pairs
        pairs = len(tables)
        per_pair = np.empty((3, pairs), dtype=np.int64)
        per_pair[0] = np.repeat(np.arange(count), reads)
        per_pair[1] = tables
        per_pair[2] = (np.arange(pairs) - table_start[per_pair[0]]) * block_size
    else:
        pair_rows, pair_index = ragged(reads)  # a pair per block a row reads: its row, which block
        per_pair = np.stack((pair_rows, tables[row_table[pair_rows] + pair_index], pair_index * block_size))
    return StepRows(*(torch.from_numpy(array).to(device) for array in (per_row, per_pair,
                                                                        np.array(logit_rows, dtype=np.int64))),
                    torch.tensor(temperatures, dtype=dtype, device=device))


def step_logits(rows: StepRows, weights: step.ModelWeights, pool_keys: list[torch.Tensor],
                pool_values: list[torch.Tensor], shape: step.Shape, native: bool = False) -> torch.Tensor:
    """Every row's token at its position through the model: its K and V written into each layer's pool
    (num_blocks, bs, KV, D) at its slot, attention over positions 0 .. its position through its
    blocks (`native`: kvlab.kernels' C++ operator, else block_attention). Returns the logits
    (R, V) of the `logit_rows`."""
    block_size = pool_keys[0].shape[1]
    cos, sin = weights.cos[rows.positions][:, None], weights.sin[rows.positions][:, None]  # (N, 1, D) each row's
    blocks, offsets = rows.slots // block_size, rows.slots % block_size
    hidden = F.embedding(rows.token_ids[:, None], weights.embed)  # (N, 1, C)
    for index, layer in enumerate(weights.layers):
        normed = rms_norm(hidden, layer.input_norm, shape.eps)
        q, k, v = step.project_qkv(normed, layer, shape, cos, sin, PLAN)  # (N, 1, H or KV, D)
        pool_keys[index].index_put_((blocks, offsets), k[:, 0])
        pool_values[index].index_put_((blocks, offsets), v[:, 0])
        if native:
            attended = ops.paged_attention(q, pool_keys[index], pool_values[index], rows.positions, rows.pair_rows,
                                           rows.pair_blocks)
        else:
            attended = block_attention(q, pool_keys[index], pool_values[index], rows.positions, rows.pair_rows,
                                       rows.pair_blocks, rows.pair_starts)
        hidden = step.linear(attended, layer.o, PLAN, step.panels_of(layer, "o")) + hidden
        hidden = hidden + step.mlp(rms_norm(hidden, layer.post_norm, shape.eps), layer, shape, PLAN)
    last = rms_norm(hidden[rows.logit_rows, 0], weights.final_norm, shape.eps)  # (R, C)
    return step.linear(last, weights.lm_head, PLAN, weights.lm_head_panels)


def packed_step_logits(per_row, per_pair, logit_rows, temperatures, packed, panels, pool_keys, pool_values,
                       shape: step.Shape, native: bool, panel_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`step_logits` on the packed weights (what is compiled: the weights one input, not forty); with
    the C++ operators (`native`), the products by kvlab::linear on the weights' `panels` (None without
    them; `panel_width` columns a panel: PackedWeights.panels).
    Returns the logits and each logit row's greedy pick (kvlab.engine.sampling.greedy_pick at its
    temperature; with the C++ operators, kvlab::greedy_pick), made while the logits are in the cache."""
    rows = StepRows(per_row, per_pair, logit_rows, temperatures)
    weights = step.unpack(packed, shape, PLAN, panels, panel_width)
    logits = step_logits(rows, weights, pool_keys, pool_values, shape, native)
    return logits, step_picks(logits, temperatures, native)


def step_picks(logits: torch.Tensor, temperatures: torch.Tensor, native: bool) -> torch.Tensor:
    """Each logit row's greedy pick at its temperature (kvlab.engine.sampling.greedy_pick); with the C++
    operators (`native`), the same picks by kvlab::greedy_pick, which divides few logits."""
    if native:
        return ops.greedy_pick(logits, temperatures)
    return sampling.greedy_pick(logits, temperatures[:, None])


class PackedStep(torch.nn.Module):
    """`packed_step_logits` as torch.export takes it: the architecture's numbers and the choice of
    operators fixed, every tensor an input (the pool's as two lists). Without panels (`panel_width`
    0) its `panels` input is an empty tensor, unread."""

    def __init__(self, shape: step.Shape, native: bool, panel_width: int):
        super().__init__()
        self.shape, self.native, self.panel_width = shape, native, panel_width

    def forward(self, per_row, per_pair, logit_rows, temperatures, packed, panels, pool_keys, pool_values):
        return packed_step_logits(per_row, per_pair, logit_rows, temperatures, packed,
                                  panels if self.panel_width else None, pool_keys, pool_values, self.shape,
                                  self.native, self.panel_width)


# the example step exported: rows, (row, block) pairs, logit rows and pool blocks of sizes no two share
# (export would otherwise take two equal sizes for one), none 0 or 1 (sizes it specialises on)
EXAMPLE_POOL_BLOCKS = 11


def example_inputs(step_inputs, block_size: int) -> list:
    """`PackedStep`'s inputs for the export: the engine's weights and panels, a pool of
    EXAMPLE_POOL_BLOCKS blocks shaped as the engine's, and three pieces fed at once, 5 rows (3 of a
    prompt, one decoding at position 2 x block_size + 1, one at 1) reading 7 (row, block) pairs, 3
    wanting logits."""
    packed, panels, pool_keys, pool_values, dtype = step_inputs
    pieces = [RowInput([1, 2, 3], 0, [0], True), RowInput([4], 2 * block_size + 1, [1, 2, 3], True),
              RowInput([5], 1, [4], True)]
    rows = step_rows(pieces, block_size, EXAMPLE_POOL_BLOCKS - 1, packed.device, [1.0] * 3, dtype)
    pool = [torch.zeros(EXAMPLE_POOL_BLOCKS, *tensor.shape[1:], dtype=tensor.dtype, device=tensor.device)
            for tensor in (*pool_keys, *pool_values)]
    layers = len(pool_keys)
    return [*rows.tensors(), packed, panels, pool[:layers], pool[layers:]]


def export_step(module: PackedStep, inputs: list) -> torch.export.ExportedProgram:
    """The step exported with its sizes symbolic: the rows (N), the (row, block) pairs (P), the logit
    rows and their temperatures (R), the pool's blocks, one size for every layer's keys and values (B)."""
    rows, pairs = torch.export.Dim("rows", min=2, max=1 << 20), torch.export.Dim("pairs", min=2, max=1 << 24)
    logit_rows, blocks = torch.export.Dim("logit_rows", min=2, max=1 << 20), torch.export.Dim("blocks", min=2, max=1 << 24)
    layers = len(inputs[6])
    dynamic = ({1: rows}, {1: pairs}, {0: logit_rows}, {0: logit_rows}, None, None, [{0: blocks}] * layers,
               [{0: blocks}] * layers)
    with torch.inference_mode():
        return torch.export.export(module, tuple(inputs), dynamic_shapes=dynamic)


_PACKED: "weakref.WeakKeyDictionary[MiniMindForCausalLM, dict]" = weakref.WeakKeyDictionary()


def packed_weights_of(model: MiniMindForCausalLM, shape: step.Shape, panel_width: int) -> step.PackedWeights:
    """The model's packed weights for the serving step (with kvlab::linear's panels `panel_width` wide, or
    none at 0), made once per model, shape and width and shared by its engines (as kvlab.engine.fast
    keeps its Decoders per model): a new engine on the same model copies nothing again, nor lays the
    same weights out in panels again (3.5 ms of a 64-request round, measured); `refresh` still copies
    them in anew when one has changed."""
    found = _PACKED.setdefault(model, {})
    if (shape, panel_width) not in found:
        found[shape, panel_width] = step.PackedWeights(model, shape, PLAN, panel_width)
    return found[shape, panel_width]


class CompiledStep:
    """A serving step's pieces through `step_logits`, compiled (where a C++ compiler is found) or eager.
    `program` is the compiled step (kvlab.engine.aot.Program, an AOTInductor package), made ready at
    the first call: `compile_s` the wall time that took, `compiles` the packages it compiled (1 where
    it compiled; 0 where it was loaded from the cache, or another engine of the architecture had it
    ready in this process)."""

    def __init__(self, model: MiniMindForCausalLM, pool: BlockPool, compile: bool = True):
        self.pool = pool
        self.shape = step.shape_of(model, model.config.max_position_embeddings)
        self.device = model.lm_head.weight.device
        self.compiled = compile and self._compiler_found()
        self.native = self.compiled and loader.usable(pool.keys[0])  # the C++ operators
        self.panel_width = ops.panel_width() if self.native else 0
        self.weights = packed_weights_of(model, self.shape, self.panel_width)
        self.compile_s = 0.0
        self.compiles = 0
        self.calls = 0
        pool_keys = pool.keys[0]  # what the package is compiled for, but the sizes it takes symbolically
        self.no_panels = torch.empty(0, device=self.device)
        self.key = (self.shape, self.native, self.panel_width, tuple(self.weights.packed.shape), self.weights.packed.dtype,
                    len(pool.keys), tuple(pool_keys.shape[1:]), pool_keys.dtype, str(self.device))
        self.program: aot.Program | None = None  # the compiled step for this key

    def _compiler_found(self) -> bool:
        if self.device.type == "cpu" and loader.find_cpp_compiler() is None:
            warnings.warn(NO_COMPILER, RuntimeWarning, stacklevel=4)
            return False
        return True

    @torch.inference_mode()
    def __call__(self, pieces: list[RowInput],
                 temperatures: list[float] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last logits of each piece that wants them, (R, V) in the pieces' order (see `step_rows`),
        and each one's greedy pick (R) at its `temperatures` entry (1 if not given), None where those
        picks are not `greedy_pick_rows`'s (kvlab.engine.sampling.greedy_pick_exact); every piece's K and
        V written into its blocks."""
        wanted = sum(wants for *_, wants in pieces)
        rows = step_rows(pieces, self.pool.block_size, self.pool.scratch_block, self.device, temperatures,
                         self.weights.packed.dtype)
        self.weights.refresh()
        self.calls += 1
        if not self.compiled:
            logits = step_logits(rows, self.weights.views, self.pool.keys, self.pool.values, self.shape, self.native)
            return logits[:wanted], self.exact(step_picks(logits, rows.temperatures, self.native)[:wanted])
        if self.program is None:
            self.program = self.ready()
        logits, picks = self.program.run(self.inputs(rows))
        return logits[:wanted], self.exact(picks[:wanted])

    def inputs(self, rows: StepRows) -> list[torch.Tensor]:
        """The compiled step's inputs for these rows, flat, as the package takes them."""
        return [*rows.tensors(), self.weights.packed, self.panels(), *self.pool.keys, *self.pool.values]

    def panels(self) -> torch.Tensor:
        return self.no_panels if self.weights.panels is None else self.weights.panels

    def ready(self) -> aot.Program:
        """The compiled step for this key: loaded, or exported on example inputs, compiled and kept."""
        library = loader.library_path(loader.find_cpp_compiler()).name if self.native else None
        # what the compiled code depends on besides the key: the threads its loops were written for, the
        # CPU its C++ was built for, the kernels' library it calls
        parts = ("serving step", repr(self.key), torch.get_num_threads(), os.uname().machine,
                 loader.cpu_flags(), library)
        modules = (sys.modules[__name__], sampling, step, model_module, loader, ops)
        module = PackedStep(self.shape, self.native, self.panel_width)
        example = (self.weights.packed, self.panels(), self.pool.keys, self.pool.values, self.weights.packed.dtype)
        program = aot.program(parts, modules, lambda: export_step(module, example_inputs(example, self.pool.block_size)))
        self.compiles += 0 if program.from_cache else 1
        self.compile_s += program.compile_s
        return program

    def exact(self, picks: torch.Tensor) -> torch.Tensor | None:
        """The picks, where in the logits' dtype they are `greedy_pick_rows`'s; else None."""
        return picks if sampling.greedy_pick_exact(self.weights.packed.dtype) else None
