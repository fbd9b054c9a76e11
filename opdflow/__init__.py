"""opdflow: a Ray-native asynchronous pipeline orchestrator for on-policy distillation.

Importing the package is instant: torch, ray and vllm load only inside the modules and
CLI commands that need them.
"""

__version__ = "0.1.0"
