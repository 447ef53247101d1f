"""What a reader sees of the measurements, free of PyTorch: the report's sections and its rendering,
the sheet's results as HTML tables, and the figures.

It reads result files and the facts; it never imports the measurements or PyTorch."""
