"""The student's model in the tools they use next (`kvlab export`): a transformers folder and a GGUF
file, each checked where it lands, in the same run, against kvlab's own `generate` on the lab's prompt.

  hf         the folder: a transformers config of the architecture MiniMind's layers are (Qwen3 with
             per-head q/k norms, Llama without), the state dict under its own key names, saved by
             `save_pretrained`; the tokenizer saved beside by transformers
  gguf_file  the file: llama.cpp's qwen3 architecture (llama without q/k norms, q and k reordered for its
             rotation) written with the `gguf` package, F32, F16 or BF16
  run        refuse what cannot go (one line naming the field, before anything is written), write into a
             folder beside the target, check it there (logits, greedy tokens, the tokenizer on the
             validation text), record the checks in `kvlab_export.json`, then move it into place

Uses the engine; transformers, gguf and llama-cpp-python are imported only when an export runs.
"""
