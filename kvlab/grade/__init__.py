"""Grading, free of PyTorch: the sheet's rules held to a results folder (`check`), a class of students'
folders graded against an answer key (this build's results, or the one a class carries), and the
class page.

It reads folders as untrusted data, the facts and the presentation's page helpers; it never imports the
measurements or PyTorch."""
