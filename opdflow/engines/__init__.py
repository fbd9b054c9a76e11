"""Rollout engines: TorchEngine (embedded default) and VLLMEngine (GPUs), one interface."""
