"""The network interface a process group binds: the one holding the node's address.

gloo and NCCL pick their interface from the hostname (gloo: the address it resolves to;
NCCL: the first interface not loopback or docker) unless told. Where the hostname
resolves to loopback, as in many containers, a learner group spanning nodes then binds
127.0.0.1 and never connects ("Gloo connectFullMesh failed ... remote=[127.0.0.1]").
Ray knows each node's address (the one its raylet registered), so every process group
binds the interface holding it: GLOO_SOCKET_IFNAME for gloo, NCCL_SOCKET_IFNAME (NCCL's
bootstrap and socket transport) for NCCL. A variable the user set is left as it is.
"""

from __future__ import annotations

import contextlib
import os
import socket

SOCKET_IFNAME = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}
"""The variable each collective backend reads its interface from."""


def interface_of(address: str) -> str | None:
    """The name of this machine's interface holding `address` (None if none does, or
    where interfaces cannot be read: Linux only, the standard library only)."""
    import ipaddress

    try:
        wanted = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return None
    for _, name in socket.if_nameindex():
        if wanted in _addresses(name):
            return name
    return None


def _addresses(name: str) -> set:
    """IPv4 (primary, SIOCGIFADDR) and IPv6 (/proc/net/if_inet6) addresses of interface
    `name`."""
    import fcntl
    import ipaddress
    import struct

    found: set = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, contextlib.suppress(OSError):
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
        found.add(ipaddress.ip_address(packed[20:24]))  # OSError above: no IPv4 address
    with contextlib.suppress(OSError), open("/proc/net/if_inet6") as table:
        for line in table:
            parts = line.split()
            if len(parts) == 6 and parts[5] == name:
                found.add(ipaddress.ip_address(bytes.fromhex(parts[0])))
    return found


def socket_env(backend: str, address: str) -> dict[str, str]:
    """The variables that bind `backend`'s sockets to the interface holding `address`:
    {"GLOO_SOCKET_IFNAME": "eth0"}, {"NCCL_SOCKET_IFNAME": "=eth0"} (exactly that name, not
    a prefix); {} when no interface holds it or the backend has no such variable."""
    var, name = SOCKET_IFNAME.get(backend), interface_of(address)
    if var is None or name is None:
        return {}
    return {var: f"={name}" if backend == "nccl" else name}


def bind_sockets(backend: str, address: str) -> dict[str, str]:
    """Set socket_env(backend, address) in this process's environment, before its process
    groups are created, unless the variable is already set; returns what is in effect."""
    for key, value in socket_env(backend, address).items():
        os.environ.setdefault(key, value)
    var = SOCKET_IFNAME.get(backend)
    return {var: os.environ[var]} if var and var in os.environ else {}
