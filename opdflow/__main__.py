"""`python -m opdflow ...` is the `opdflow` command."""

from opdflow.cli import main

main()
