"""Linux network namespaces joined by a bridge: the network of the local multi-node cluster.

Each node of `netcluster.NetCluster` is a network namespace with one veth link to a
bridge in the root namespace, and its own address in 198.18.0.0/15 (reserved for network
benchmarks, RFC 2544): the nodes reach each other and the root namespace, and nothing
else (no default route, no uplink on the bridge), so no packet leaves the machine. A
node's processes also get their own mount namespace (`Namespace.argv`): a private tmpfs
on /tmp and /dev/shm, as a machine of its own has.

Names and the subnet are unique per instance (a pid-derived part), so several clusters
can run side by side; `ip` is called with explicit names only, and everything created is
deleted by name. Needs root, iproute2 (`ip netns`) and util-linux (`unshare`):
`unavailable()` says which is missing, so callers can skip with the reason.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

BENCHMARK_NET = ipaddress.ip_network("198.18.0.0/15")
"""The only range node addresses are taken from (RFC 2544, network benchmarks)."""
SUBNETS = 512
"""/24 subnets in BENCHMARK_NET; an instance takes one, starting at its pid's slot."""


class NetnsError(RuntimeError):
    """An `ip` or `unshare` command failed; the message has the command and its stderr."""


def ip(*args: str, check: bool = True) -> str:
    """Run `ip ARGS`; its stdout (raises NetnsError with stderr when it fails and `check`)."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def unavailable() -> str | None:
    """Why network namespaces cannot be used here (None when they can): not Linux, not root,
    no `ip`/`unshare`, or the kernel refuses a namespace, veth pair or bridge."""
    if os.uname().sysname != "Linux":
        return f"network namespaces need Linux (this is {os.uname().sysname})"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add, veth pairs, mounts)"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed ({package})"
    probe = f"opdprobe{os.getpid()}"
    try:
        ip("netns", "add", probe)
        try:
            ip("link", "add", f"{probe[:10]}b", "type", "bridge")
            ip("link", "del", f"{probe[:10]}b")
            ip("-n", probe, "link", "add", "opdpa", "type", "veth", "peer", "name", "opdpb")
        finally:
            ip("netns", "del", probe, check=False)
    except NetnsError as exc:
        return f"the kernel refused a network namespace, bridge or veth pair: {exc}"
    return None


def used_subnets() -> set[ipaddress.IPv4Network]:
    """/24 networks of every IPv4 address in the root namespace."""
    out = ip("-o", "-4", "addr", "show")
    nets = set()
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            iface = ipaddress.ip_interface(parts[parts.index("inet") + 1])
            nets.add(ipaddress.ip_network(f"{iface.ip}/24", strict=False))
    return nets


def pick_subnet(pid: int) -> ipaddress.IPv4Network:
    """A /24 of BENCHMARK_NET no root-namespace address is in, from the pid's slot on."""
    taken = used_subnets()
    first = int(BENCHMARK_NET.network_address)
    for i in range(SUBNETS):
        net = ipaddress.ip_network(
            f"{ipaddress.ip_address(first + 256 * ((pid + i) % SUBNETS))}/24"
        )
        if net not in taken:
            return net
    raise NetnsError(f"every /24 of {BENCHMARK_NET} is in use on this machine")


@dataclass(frozen=True)
class Bridge:
    """The bridge in the root namespace every node's veth joins, with the root's address."""

    name: str
    address: ipaddress.IPv4Interface

    def create(self) -> None:
        ip("link", "add", self.name, "type", "bridge")
        ip("addr", "add", str(self.address), "dev", self.name)
        ip("link", "set", self.name, "up")

    def delete(self) -> None:
        ip("link", "del", self.name, check=False)


@dataclass(frozen=True)
class Namespace:
    """One node's network namespace: `eth0` (its veth end, `address`) and `lo`; the other
    end, `veth`, sits on the bridge in the root namespace."""

    name: str
    veth: str
    address: ipaddress.IPv4Interface

    def create(self, bridge: Bridge) -> None:
        """The namespace, its veth pair on the bridge, its address; links up."""
        ip("netns", "add", self.name)
        ip("link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.name)
        ip("link", "set", self.veth, "master", bridge.name, "up")
        ip("-n", self.name, "addr", "add", str(self.address), "dev", "eth0")
        ip("-n", self.name, "link", "set", "eth0", "up")
        ip("-n", self.name, "link", "set", "lo", "up")

    def exists(self) -> bool:
        return self.name in ip("netns", "list", check=False).split()

    def pids(self) -> list[int]:
        """Every process in the namespace (`ip netns pids`)."""
        if not self.exists():
            return []
        return [int(p) for p in ip("netns", "pids", self.name, check=False).split()]

    def kill_all(self, signal_number: int = 9) -> list[int]:
        """Send `signal_number` to every process in the namespace, by pid; the pids."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal_number)
        return pids

    def link(self, up: bool) -> None:
        """Take the node's link to the bridge down (a partition) or bring it back up."""
        ip("link", "set", self.veth, "up" if up else "down")

    def delete(self) -> None:
        """Delete the namespace (its veth pair goes with it) and, if left, the root end."""
        ip("netns", "del", self.name, check=False)
        ip("link", "del", self.veth, check=False)

    def argv(self, command: Sequence[str], private: Sequence[str], shm_mb: int) -> list[str]:
        """`command` run inside the namespace, in a mount namespace of its own where each of
        `private` (e.g. /tmp) is a fresh tmpfs and /dev/shm one of `shm_mb` MiB."""
        mounts = " && ".join(
            [f"mount -t tmpfs -o mode=1777 tmpfs {shlex.quote(p)}" for p in private]
            + [f"mount -t tmpfs -o size={shm_mb}m,mode=1777 tmpfs /dev/shm"]
        )
        return [
            "ip", "netns", "exec", self.name,
            "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", f'{mounts} && exec "$@"', "sh", *command,
        ]  # fmt: skip
