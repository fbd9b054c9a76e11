"""CLI commands grouped by topic; cli.py registers each with one line."""
