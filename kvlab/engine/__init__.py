"""MiniMind itself: the model, its sampling rules, its checkpoint and data formats, its tokenizer.

The engine imports no other part of kvlab (kvlab.io aside), so it can be read, tested and
compared with MiniMind's own code on its own."""
