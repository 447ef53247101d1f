"""MiniMind itself: the model, its sampling rules, its checkpoint and data formats, its tokenizer.

The engine imports no other part of kvlab (kvlab.io aside, and kvlab.kernels' C++ operators, which
its step calls only for the serving engine), so it can be read, tested and compared with MiniMind's
own code on its own."""
