"""The measurements that run the model (PyTorch): the lab sheet's steps, the curves and the serving
measurements beyond it, the cost of several models, a step's anatomy, and the engine held against
MiniMind's own code.

It uses the engine and the facts, never the default model (the lab runs the same on a user's own
MiniMind files), and never the presentation or the grading."""
