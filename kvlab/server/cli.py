"""`kvlab serve`: MiniMind behind OpenAI's API, on loopback, from a build's SFT checkpoint by default.

    kvlab serve                                   # results/default/sft.pth and results/default/tokenizer/
    kvlab serve --checkpoint /opt/mm/sft.pth --tokenizer /opt/mm/tokenizer --port 8000
    python -m kvlab.server serve ...              # the same, from any checkout

The checkpoint is inspected as the workflow inspects one (kvlab.checkpoints.inspect_checkpoint: layout,
config, head count, the tokenizer's fit; or the workflow's own inspection, --inspection) and loaded as
that inspection says. The engine's knobs are ServingConfig's, with its defaults; its step is compiled
before the server listens. SIGTERM (or Ctrl+C) starts the drain: new requests and /health get a 503 with
Retry-After while the running ones go on for --drain-seconds; what is left is aborted, then the listener
closes and the process exits 0. A second SIGTERM or Ctrl+C stops at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
from dataclasses import fields
from pathlib import Path

from kvlab.config import DEFAULT_INPUTS
from kvlab.engine.config import KV_BYTES_PER_ELEMENT
from kvlab.server.serving_thread import RECENT_STEPS
from kvlab.serving import ServingConfig

# the engine's knobs a command-line option sets (its step records: the live page's, RECENT_STEPS)
DEFAULTS = {field.name: field.default for field in fields(ServingConfig) if field.name != "step_records"}
# How often the drain looks whether the running requests have ended.
DRAIN_POLL_S = 0.02
log = logging.getLogger("kvlab.server")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="kvlab", description="kvlab's commands beside the workflow.")
    commands = top.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a MiniMind checkpoint with OpenAI's API (docs/serving.md)",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = serve.add_argument_group("the model")
    model.add_argument("--checkpoint", default=DEFAULT_INPUTS["sft"], help="a MiniMind .pth (default: %(default)s)")
    model.add_argument("--tokenizer", default=DEFAULT_INPUTS["tokenizer"],
                       help="its Hugging Face tokenizer folder (default: %(default)s)")
    model.add_argument("--inspection", help="the workflow's inspection of the checkpoint (results/checkpoints/sft.json); "
                                            "without it the checkpoint is inspected here")
    model.add_argument("--model-overrides", default="{}", type=json.loads,
                       help="architecture fields the tensors cannot reveal, as JSON (the config's model_overrides)")
    model.add_argument("--val-data", default=DEFAULT_INPUTS["val_data"],
                       help="validation text, read only to measure a MiniMind2 file's head count (default: %(default)s)")
    model.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    model.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    model.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    model.add_argument("--served-model-name", help="the name clients ask for (default: the checkpoint's file stem)")
    http = serve.add_argument_group("the server")
    http.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: loopback only)")
    http.add_argument("--port", type=int, default=8000, help="0: a free one (see --port-file)")
    http.add_argument("--port-file", help="write the port listened on to this file")
    http.add_argument("--max-waiting", type=int, default=64,
                      help="requests that may wait for admission; the next gets a 503 (default: %(default)s)")
    http.add_argument("--drain-seconds", type=float, default=10.0,
                      help="on SIGTERM, how long running requests may go on before they are aborted")
    http.add_argument("--access-log", action="store_true", help="log every HTTP request")
    engine = serve.add_argument_group("the serving engine (kvlab.serving.ServingConfig)")
    for knob in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens"):
        engine.add_argument(f"--{knob.replace('_', '-')}", type=int, default=DEFAULTS[knob],
                            help="default: %(default)s")
    engine.add_argument("--policy", default=DEFAULTS["policy"], choices=("continuous", "static"))
    engine.add_argument("--matmuls", default=DEFAULTS["matmuls"], choices=("per_request", "fused"))
    engine.add_argument("--chunked-prefill", action="store_true", default=DEFAULTS["chunked_prefill"])
    engine.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false",
                        default=DEFAULTS["prefix_caching"])
    engine.add_argument("--enforce-eager", dest="compile", action="store_false", default=DEFAULTS["compile"],
                        help="every step eager, request by request (default: one compiled step for all the rows)")
    export = commands.add_parser("export", help="a checkpoint as a transformers folder or a GGUF file, checked "
                                 "there against kvlab's generate (docs/export.md)")
    export.add_argument("checkpoint", type=Path, help="a MiniMind .pth")
    export.add_argument("--tokenizer", type=Path, default=Path(DEFAULT_INPUTS["tokenizer"]),
                        help="its tokenizer folder (default: %(default)s)")
    export.add_argument("--to", required=True, choices=("hf", "gguf"),
                        help="hf: a transformers folder; gguf: a llama.cpp file (OUT ends in .gguf)")
    export.add_argument("out", type=Path, help="where the export goes (a path that is free)")
    export.add_argument("--type", dest="file_type", default="f32", choices=("f32", "f16", "bf16"),
                        help="the GGUF's weights (default: %(default)s)")
    export.add_argument("--prompt-json", type=Path, default=Path("results/prompt.json"),
                        help="the lab's prompt, the greedy tokens are checked on (default: %(default)s)")
    export.add_argument("--val-data", type=Path, default=Path(DEFAULT_INPUTS["val_data"]),
                        help="validation texts the tokenizer is checked on (default: %(default)s)")
    export.add_argument("--texts", type=int, default=64, help="how many of them (default: %(default)s)")
    export.add_argument("--new-tokens", type=int, default=64, help="greedy tokens checked (default: %(default)s)")
    export.add_argument("--model-overrides", default="{}", type=json.loads,
                        help="JSON of the config fields the checkpoint does not reveal, as the config's model_overrides")
    engine.add_argument("--kv-dtype", default=DEFAULTS["kv_dtype"], choices=tuple(KV_BYTES_PER_ELEMENT),
                        help="what the cache's blocks store (kvlab.engine.kv_dtype; the model computes in --dtype); "
                             "other than float32, served the eager way (default: %(default)s)")
    return top


def load(args):
    """The engine on the checkpoint, and the tokenizer. Raises ValueError with one line naming the file."""
    import torch

    from kvlab.checkpoints import inspect_checkpoint, load_inspected
    from kvlab.engine.tokenizer import load_tokenizer, vocab_mismatch
    from kvlab.io import read_json
    from kvlab.serving import ServingEngine

    checkpoint, tokenizer_dir = Path(args.checkpoint), Path(args.tokenizer)
    built = "build the embedded default first (snakemake --cores 1 results/default/sft.pth), or give --checkpoint " \
            "and --tokenizer"
    if not checkpoint.is_file():
        raise ValueError(f"--checkpoint {checkpoint}: file not found" + (f"; {built}" if
                         str(checkpoint) == DEFAULT_INPUTS["sft"] else ""))
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise ValueError(f"--tokenizer {tokenizer_dir}: no tokenizer.json there" + (f"; {built}" if
                         str(tokenizer_dir) == DEFAULT_INPUTS["tokenizer"] else ""))
    tokenizer = load_tokenizer(tokenizer_dir)
    if args.inspection:
        inspection = read_json(args.inspection)
    else:
        inspection = inspect_checkpoint(checkpoint, "sft", args.model_overrides, tokenizer, args.val_data)
    torch.set_num_threads(args.threads)
    model, _ = load_inspected(checkpoint, inspection, args.device, args.dtype)
    mismatch = vocab_mismatch(tokenizer.vocab_size, model.config.vocab_size)
    if mismatch:
        raise ValueError(f"--tokenizer {tokenizer_dir} does not belong to --checkpoint {checkpoint}: {mismatch}")
    knobs = {knob: getattr(args, knob) for knob in DEFAULTS}
    if knobs["kv_dtype"] != "float32" and knobs["compile"]:
        log.info("--kv-dtype %s: served the eager way (the compiled step reads float32 blocks)", knobs["kv_dtype"])
        knobs["compile"] = False
    config = ServingConfig(**knobs, step_records=RECENT_STEPS)
    engine = ServingEngine(model, config)
    seconds = engine.warm_up()  # ready before the first request, not at its first token
    if engine.compiled:
        program = engine.runner.compiled.program
        log.info("the engine's step %s %s in %.1f s", "loaded from" if program.from_cache else "compiled into",
                 program.path, seconds)
    return engine, tokenizer


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ValueError(f"--host {host} --port {port}: cannot listen there ({err.strerror})") from None
    sock.set_inheritable(True)
    return sock


def serve(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.max_waiting < 1 or args.drain_seconds < 0:
        print("kvlab serve: --max-waiting must be >= 1 and --drain-seconds >= 0", file=sys.stderr)
        return 2
    try:
        engine, tokenizer = load(args)
        sock = bind(args.host, args.port)
    except (ValueError, FileNotFoundError) as err:
        print(f"kvlab serve: {err}", file=sys.stderr)
        return 1
    import uvicorn

    from kvlab.server.app import ServerContext, create_app

    name = args.served_model_name or Path(args.checkpoint).stem
    context = ServerContext.build(engine, tokenizer, name, args.max_waiting)
    port = sock.getsockname()[1]
    if args.port_file:
        Path(args.port_file).write_text(f"{port}\n", encoding="utf-8")
    log.info("serving %s (%s, %d blocks of %d tokens, policy %s) on http://%s:%d", name, args.checkpoint,
             engine.config.num_blocks, engine.config.block_size, engine.config.policy, args.host, port)

    class DrainingServer(uvicorn.Server):
        """uvicorn's server, which on SIGTERM or SIGINT drains before it shuts down: the serving thread
        refuses new requests (503 with Retry-After, /health 503) and lets the running ones go on for
        --drain-seconds, while the listener stays open, so a client that comes during the drain is told to
        retry rather than refused a connection. Once nothing runs, uvicorn's own shutdown closes the listener and waits for
        the last answers to be sent. A second signal shuts down at once."""

        draining = False

        async def serve(self, sockets=None):
            self.event_loop = asyncio.get_running_loop()
            await super().serve(sockets)

        def handle_exit(self, sig, frame):
            if self.draining:  # a second signal: the drain ends now (what runs is aborted), then shut down as
                # after any drain; not uvicorn's forced exit, which cancels the app's lifespan mid-await and logs it
                self.event_loop.call_soon_threadsafe(context.thread.drain, 0.0)
                return
            self.draining = True
            # a signal handler must not take the serving thread's lock: the drain starts on the event loop
            self.event_loop.call_soon_threadsafe(self.start_drain, sig, frame)

        def start_drain(self, sig, frame):
            context.thread.drain(args.drain_seconds)
            self.event_loop.create_task(self.shut_down_when_drained(sig, frame))

        async def shut_down_when_drained(self, sig, frame):
            while not context.thread.drained:
                await asyncio.sleep(DRAIN_POLL_S)
            log.info("drained: no request runs; closing the listener")
            uvicorn.Server.handle_exit(self, sig, frame)

    config = uvicorn.Config(create_app(context), log_level="info", access_log=args.access_log, lifespan="on",
                            timeout_graceful_shutdown=args.drain_seconds + 2)
    server = DrainingServer(config)
    # uvicorn raises the signal again once it has shut down gracefully; with these handlers that ends
    # nothing, and the process exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    asyncio.run(server.serve(sockets=[sock]))
    log.info("stopped after %d engine steps", context.thread.steps)
    return 0 if server.started else 1


def export(args) -> int:
    """`kvlab export`: 0 where the export holds kvlab's tokens, 1 where a check found a difference (the
    export and its record stay), 2 where it could not be made (one line, nothing written)."""
    from kvlab.engine.checkpoint import CheckpointError
    from kvlab.engine.data import read_texts
    from kvlab.engine.tokenizer import TokenizerError
    from kvlab.export.run import ExportError, agrees, export as run_export, record_path, said
    from kvlab.io import read_json

    try:
        for flag, path in (("--prompt-json", args.prompt_json), ("--val-data", args.val_data),
                           ("CHECKPOINT", args.checkpoint)):
            if not path.is_file():
                raise ExportError(f"{flag} {path}: file not found")
        record = run_export(args.checkpoint, args.tokenizer, args.to, args.out, read_json(args.prompt_json)["ids"],
                            read_texts(args.val_data)[:args.texts], args.file_type, args.new_tokens,
                            args.model_overrides)
    except (ExportError, CheckpointError, TokenizerError) as err:
        print(f"kvlab export: {err}", file=sys.stderr)
        return 2
    print(f"{said(record, args.out)}; record: {record_path(args.to, args.out)}")
    return 0 if agrees(record) else 1


def main(argv=None) -> None:
    """The `kvlab` command. Exits the process: once the server has shut down there is nothing left to
    tidy, and the interpreter's teardown of PyTorch's modules would take seconds more, so the process
    ends at once (logs and output flushed)."""
    args = parser().parse_args(argv)
    status = serve(args) if args.command == "serve" else export(args)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
