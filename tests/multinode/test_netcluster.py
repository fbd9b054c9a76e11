"""The namespaced cluster itself: nodes at their own addresses with their own resources,
private /tmp, one shared directory, token authentication, and a teardown that leaves
nothing behind."""

from __future__ import annotations

import ipaddress
import urllib.error
import urllib.request

import pytest

from opdflow.testbed.netns import BENCHMARK_NET, ip

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def netcluster(shared_netcluster):
    """The session's three nodes: these tests leave them as they found them."""
    return shared_netcluster


def test_nodes_have_their_own_address_and_resources(netcluster):
    table = {n["node_ip"]: n for n in netcluster.ray_nodes() if n["state"] == "ALIVE"}
    assert sorted(table) == sorted(n.ip for n in netcluster.nodes)
    for node in netcluster.nodes:
        assert ipaddress.ip_address(node.ip) in BENCHMARK_NET
        for name, amount in node.spec.resources.items():
            assert table[node.ip]["resources_total"][name] == amount


def test_tmp_is_private_and_shared_storage_is_shared(netcluster):
    a, b = netcluster.nodes[:2]
    netcluster.run_in(a, ["sh", "-c", "echo a > /tmp/only-on-a"])
    (netcluster.shared / "seen-by-all").write_text("shared")
    assert "only-on-a" not in netcluster.run_in(b, ["ls", "/tmp"])
    assert "only-on-a" in netcluster.run_in(a, ["ls", "/tmp"])
    for node in netcluster.nodes:
        assert netcluster.run_in(node, ["cat", str(netcluster.shared / "seen-by-all")]) == "shared"


def test_the_dashboard_wants_the_token(netcluster):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as err:
        opener.open(netcluster.dashboard + "/api/v0/nodes", timeout=10)
    assert err.value.code in (401, 403)
    assert netcluster.get("/api/v0/nodes")["result"] is True  # with the token


def test_teardown_leaves_nothing(netcluster_factory):
    from support.netcluster import NodeSpec

    c = netcluster_factory([NodeSpec("solo", 1)])
    names = [n.ns.name for n in c.nodes]
    links = [c.bridge.name, *(n.ns.veth for n in c.nodes)]
    assert all(n.ns.pids() for n in c.nodes)
    base = c.base
    c.stop()
    assert not set(names) & set(ip("netns", "list").split())
    assert not [link for link in links if link in ip("-o", "link", "show")]
    assert not base.exists()


def test_process_groups_on_a_node_bind_its_address_not_the_hostnames(netcluster):
    """Inside a node the hostname resolves to loopback (as in many containers); gloo and
    NCCL's bootstrap are pointed at the interface holding the node's address instead."""
    import json
    import sys

    node = netcluster.nodes[1]
    code = (
        "import json, socket; from opdflow.compute.interfaces import socket_env; "
        f"print(json.dumps([socket.gethostbyname(socket.gethostname()), "
        f"socket_env('gloo', '{node.ip}'), socket_env('nccl', '{node.ip}')]))"
    )
    hostname_ip, gloo, nccl = json.loads(netcluster.run_in(node, [sys.executable, "-c", code]))
    assert gloo == {"GLOO_SOCKET_IFNAME": "eth0"} and nccl == {"NCCL_SOCKET_IFNAME": "=eth0"}
    assert hostname_ip != node.ip  # what gloo would have bound without it
