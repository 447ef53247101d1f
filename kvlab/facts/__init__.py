"""What both sides of the lab read, free of PyTorch: the sheet's files and headings, the formulas and
the names of modes and columns, the statistics a timing is judged by, the comparison's arithmetic, and
the registry of every result (its name, path, caption and report category).

It imports the engine's torch-free config at most, so the measurements, the presentation, the grading
and Snakemake's own process can all read it."""
