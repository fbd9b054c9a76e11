"""A local cluster starts whatever auth mode this process's Ray cached before.

Ray reads RAY_AUTH_MODE once and caches it, while a GCS it starts reads the environment:
a process whose environment changed since (a client of a token cluster, then a local run;
a local `ray.init` itself sets RAY_AUTH_MODE=token where a token exists) had a GCS that
wanted a token from a driver that sent none, and the start failed after Ray's retries.
`connect()` brings the cache back to the environment first. Runs in a child Python (its
own process group and cluster), so this session's Ray state is untouched.
"""

from __future__ import annotations

import os
from pathlib import Path

from support.processes import run_python_group

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import os
import ray
from ray._raylet import AuthenticationMode, Config, get_authentication_mode
from opdflow.cluster.connection import connect

os.environ["RAY_AUTH_MODE"] = "disabled"
Config.initialize("")  # what Ray caches: disabled
os.environ["RAY_AUTH_MODE"] = "token"  # what the environment says by the time of the run
assert connect(1), "expected to start a local cluster"
assert ray.get(ray.remote(lambda: 41).remote()) + 1 == 42
print("token mode:", get_authentication_mode() == AuthenticationMode.TOKEN)
ray.shutdown()
"""


def test_a_local_cluster_starts_after_the_environment_changed_the_auth_mode():
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT)
    code, out, err = run_python_group(CHILD, env, 300)
    assert code == 0, err[-3000:]
    assert "token mode: True" in out, out  # the mode the environment asked for
