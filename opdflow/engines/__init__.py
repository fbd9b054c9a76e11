"""Rollout engines: TorchEngine (embedded default) and VLLMEngine (GPUs), one interface.

base.py is the interface; torch_engine.py the embedded engine; recipes.py the precision
recipes and how they apply (fakequant.py, quantize.py, kvcache.py). vllm_engine.py runs
vLLM behind the same interface, with vllm_settings.py (its `LLM(...)` arguments),
vllm_version.py (the release it needs) and vllm_worker.py (what it adds inside vLLM's
workers); only vllm_engine.py imports vllm.

May import: opdflow.core, opdflow.errors, opdflow.inputs (model loading) and, lazily,
opdflow.weights (versions, their transports); torch, transformers, and vllm (only
vllm_engine.py). Imported by stages/, analysis/ and commands/.
"""
