"""Connecting to Ray: an embedded loopback cluster by default, a real one via RAY_ADDRESS.

One code path from a laptop to a cluster: with no address, `ray.init` starts a local
cluster on 127.0.0.1 with no dashboard; with RAY_ADDRESS (or inside a Ray job) it joins
that cluster.

Why the embedded cluster needs LOOPBACK_ENV: `_node_ip_address="127.0.0.1"` alone is not
enough. Ray 2.60's `ray.init` (and `ray start --node-ip-address 127.0.0.1`) replaces a
loopback node address with the machine's interface address
(`ray._private.services.resolve_ip_for_localhost`), and its GCS, raylet, object manager
and core-worker gRPC servers bind to all interfaces for any node address but exactly
127.0.0.1. Ray keeps the loopback address only when RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is
off (`ray_constants.ENABLE_RAY_CLUSTER`, read once at `import ray`); then every server
binds 127.0.0.1 (tests/ray/test_loopback.py checks the bound sockets).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

QUIET_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_OFFLINE": "1",
}
"""Environment of every actor: no progress bars or hub calls from transformers."""


LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""Environment under which Ray keeps a local node on 127.0.0.1 (see the module docstring);
`ray start --head --node-ip-address 127.0.0.1` needs it too."""


@contextlib.contextmanager
def loopback_node() -> Iterator[None]:
    """While Ray starts a local node: LOOPBACK_ENV in the environment (the processes Ray
    spawns inherit it) and in Ray's constant (read at import, before this runs); both are
    restored afterwards, so joining a real cluster later in this process is unaffected."""
    try:
        from ray._private import ray_constants
    except ImportError:  # a Ray laid out otherwise: the environment is all there is to set
        ray_constants = None
    saved_env = {k: os.environ.get(k) for k in LOOPBACK_ENV}
    saved_flag = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ.update(LOOPBACK_ENV)
    if saved_flag is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if saved_flag is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved_flag


def quiet_env() -> None:
    """QUIET_ENV in this process's environment, where not set already (a command that loads
    models without Ray, and every driver before it starts actors)."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)


def sync_auth() -> None:
    """Make this process's Ray follow RAY_AUTH_MODE / RAY_AUTH_TOKEN[_PATH] as they are now:
    Ray reads the mode once and caches the token, so a process that talks to a second
    cluster (another token, or none) would still send the first one's. A local `ray.init`
    sets RAY_AUTH_MODE=token for this process when a token exists (~/.ray/auth_token), and
    its GCS follows the environment: a cached mode that disagrees fails the start."""
    try:
        from ray._raylet import (
            AuthenticationMode,
            AuthenticationTokenLoader,
            Config,
            get_authentication_mode,
        )
    except ImportError:  # a Ray without token authentication
        return
    wants_token = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    if wants_token != (get_authentication_mode() == AuthenticationMode.TOKEN):
        Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def connect(num_cpus: float | None = None) -> bool:
    """Initialise Ray if needed; returns True when this call started a local cluster."""
    import ray

    if ray.is_initialized():
        return False
    quiet_env()
    sync_auth()
    env = {"env_vars": QUIET_ENV}
    address = os.environ.get("RAY_ADDRESS")
    if address:
        if _on_loopback(address):  # a cluster of this machine's own on 127.0.0.1: join it there
            with loopback_node():
                ray.init(
                    address=address,
                    _node_ip_address="127.0.0.1",
                    runtime_env=env,
                    log_to_driver=True,
                )
        else:
            ray.init(address=address, runtime_env=env, log_to_driver=True)
        return False
    cpus = max(float(os.cpu_count() or 1), num_cpus or 0.0)
    with loopback_node():
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


def _on_loopback(address: str) -> bool:
    """Whether a GCS address "HOST:PORT" is on loopback (a Ray Client "ray://" address or
    "auto" is not)."""
    if "://" in address or ":" not in address:
        return False
    host = address.rsplit(":", 1)[0].strip("[]")
    return host == "localhost" or host.startswith("127.") or host == "::1"
