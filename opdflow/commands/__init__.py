"""CLI commands, one module per topic; registered at the end of opdflow/cli.py."""
