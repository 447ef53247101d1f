"""The embedded default: a small Korean corpus, a byte-level BPE tokenizer and two MiniMind
checkpoints (pretrained, then SFT), built from nothing when no course files are given.

It may use the engine, never the lab."""
