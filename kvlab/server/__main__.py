"""`python -m kvlab.server serve ...`: `kvlab serve` from any checkout (the console script is the installed one's)."""
from kvlab.server.cli import main

main()
