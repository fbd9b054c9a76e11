"""A namespaced cluster refuses, before it creates anything, an interpreter, checkout or
state directory its nodes cannot see: each node mounts its own empty /tmp, so a venv there
would fail on every node as "ray: not found"."""

from __future__ import annotations

from pathlib import Path

import pytest

from opdflow.testbed.netcluster import NetCluster
from opdflow.testbed.raynode import NodeSpec, hidden_from_nodes


def test_paths_under_a_private_dir_are_hidden_and_others_are_not():
    assert hidden_from_nodes(["/tmp/ci/.venv/bin/python", "/tmp"]) == [
        "/tmp/ci/.venv/bin/python",
        "/tmp",
    ]
    assert hidden_from_nodes(["/var/tmp/opdnet-1", "/tmpfoo/x", "/work/repo"]) == []


@pytest.mark.parametrize("where", ["python", "pythonpath", "base"])
def test_a_cluster_whose_nodes_cannot_see_a_path_is_refused_naming_it(where):
    hidden = "/tmp/elsewhere/.venv/bin/python" if where == "python" else "/tmp/elsewhere"
    kwargs = {"python": "/usr/bin/python3", "pythonpath": "/var/tmp/checkout"} | {where: hidden}
    base = kwargs.pop("base", "/var/tmp/opdnet-refused-test")
    c = NetCluster(Path(base), owned=False, **kwargs)
    with pytest.raises(
        ValueError, match=rf"cannot see {hidden} \({where}\): each node mounts its own empty /tmp"
    ):
        c.start([NodeSpec("solo", 1)])
    assert not c.nodes and not Path(base).exists()  # refused before anything was made
