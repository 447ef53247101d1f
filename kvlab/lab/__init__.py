"""The lab's measurements (the lab sheet's steps and the curves beyond it) and their presentation
(report, figures, self-check).

It may use the engine, never the default model: the lab runs the same on a user's own MiniMind files."""
