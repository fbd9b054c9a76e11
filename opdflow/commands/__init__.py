"""CLI command modules, one per topic, registered in opdflow/cli.py."""
