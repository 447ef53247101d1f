"""`kvlab serve` on the SFT checkpoint at rising request rates, each server of the config, measured over HTTP."""
from kvlab.engine.data import read_texts
from kvlab.io import write_csv_atomic, write_json_atomic
from kvlab.measure.prompt import document_prompts
from kvlab.measure.serving_bench import BenchPlan, Workload, serve_bench
from kvlab.workflow import load_tokenizer_input, run


def main(snakemake):
    p = snakemake.params
    tokenizer = load_tokenizer_input(snakemake)
    texts = [text for text in read_texts(snakemake.input.val_data) if tokenizer.encode(text)]
    prompts = document_prompts(tokenizer, texts, len(texts), p.prompt_tokens, source=snakemake.input.val_data,
                               key="extras.serve_bench.prompt_tokens")
    server = ["--checkpoint", snakemake.input.sft, "--inspection", snakemake.input.sft_inspected,
              "--tokenizer", tokenizer.folder, "--device", p.device, "--dtype", p.dtype, "--threads", 1,
              "--max-num-seqs", p.max_num_seqs, "--num-blocks", p.num_blocks, "--max-waiting", p.max_waiting,
              "--no-prefix-caching"]
    workload = Workload(prompts, p.output_tokens, p.temperature, p.top_p, p.seed)
    plan = BenchPlan(tuple(p.servers), tuple(p.rate_fractions), p.lone_requests, p.saturation_requests,
                     p.seconds_per_rate, p.max_requests, p.request_timeout_s, p.slo_ttft_factor, p.slo_tpot_factor)
    rows, side = serve_bench(server, workload, plan)
    write_json_atomic(snakemake.output.serve_bench_runs, {**side, "prompts": len(prompts)})
    write_csv_atomic(snakemake.output.serve_bench, rows)


run(snakemake, main)
