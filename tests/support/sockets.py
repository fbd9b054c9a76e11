"""Reading what a process tree listens on and talks to, to check a cluster stays on loopback.

Only reads the kernel's socket tables (psutil, which Ray ships); never opens a connection.
"""

from __future__ import annotations

import ipaddress


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1, and IPv4-mapped loopback (::ffff:127.0.0.1, how dual-stack gRPC
    sockets bound to 127.0.0.1 show)."""
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def sockets(root_pid: int) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]:
    """(listening, connected) sockets of `root_pid` and all its descendants, as
    (process name, address, port): bound local addresses of LISTEN sockets, and remote
    addresses of every socket that has one."""
    import psutil  # Ray's vendored copy is importable once ray is

    root = psutil.Process(root_pid)
    listening, connected = set(), set()
    for proc in [root, *root.children(recursive=True)]:
        try:
            name = proc.name()
            conns = proc.net_connections(kind="inet")
        except psutil.Error:  # exited meanwhile
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN:
                listening.add((name, c.laddr.ip, c.laddr.port))
            elif c.raddr:
                connected.add((name, c.raddr.ip, c.raddr.port))
    return sorted(listening), sorted(connected)
