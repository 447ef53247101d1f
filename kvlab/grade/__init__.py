"""Grading, free of PyTorch: the sheet's rules held to a results folder (`check`), a class of students'
folders graded against this build's answer key, and the class page.

It reads folders as untrusted data, the facts and the presentation's page helpers; it never imports the
measurements or PyTorch."""
