"""The serving measurements' compiled steps, compiled once a build and kept (kvlab.engine.aot): the
engine's step and the single-request path's, for the trace serve_trace serves; serve_trace and
serve_rates then load them. Writes the seconds it took and where each step is kept."""
import platform

import torch

from kvlab.checkpoints import load_model_input
from kvlab.engine.data import read_texts
from kvlab.facts.serving import ServingSettings
from kvlab.io import write_json_atomic
from kvlab.measure.prompt import document_prompts
from kvlab.measure.serving_run import ready_steps, said
from kvlab.measure.serving_trace import engine_config
from kvlab.measure.serving_workloads import check_block_size, main_trace
from kvlab.measure.steps import use_threads
from kvlab.workflow import load_tokenizer_input, log, run


def main(snakemake):
    p = snakemake.params
    settings = ServingSettings.of(p.serving)
    model, device = load_model_input(snakemake, "pretrain")
    check_block_size(model, settings.block_size)
    tokenizer = load_tokenizer_input(snakemake)
    prompts = document_prompts(tokenizer, read_texts(snakemake.input.val_data), settings.requests,
                               settings.prompt_cap, source=snakemake.input.val_data, key="extras.serving.requests")
    use_threads(p.threads)
    steps = ready_steps(model, engine_config(settings, "continuous"), main_trace(prompts, settings, None),
                        settings.compile)
    log.info("compiled steps ready: %s", said(steps))
    write_json_atomic(snakemake.output.compiled_steps,
                      {"steps": steps, "torch": torch.__version__, "threads": torch.get_num_threads(),
                       "machine": platform.machine(), "device": str(device)})


run(snakemake, main)
