"""Connecting to Ray: an embedded loopback cluster by default, a real one via RAY_ADDRESS.

One code path from a laptop to a cluster: with no address, `ray.init` starts a local
cluster bound to 127.0.0.1 with no dashboard; with RAY_ADDRESS (or inside a Ray job)
it joins that cluster.
"""

from __future__ import annotations

import os

QUIET_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_OFFLINE": "1",
}
"""Environment of every actor: no progress bars or hub calls from transformers."""


def connect(num_cpus: float | None = None) -> bool:
    """Initialise Ray if needed; returns True when this call started a local cluster."""
    import ray

    if ray.is_initialized():
        return False
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    env = {"env_vars": QUIET_ENV}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=env, log_to_driver=True)
        return False
    cpus = max(float(os.cpu_count() or 1), num_cpus or 0.0)
    ray.init(
        address="local",  # never attach to another cluster found on this machine
        num_cpus=int(cpus + 0.999),
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        runtime_env=env,
        log_to_driver=True,
        configure_logging=False,
    )
    return True
