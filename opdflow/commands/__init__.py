"""CLI commands by topic; each module's click commands are registered in opdflow/cli.py."""
