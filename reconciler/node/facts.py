"""The node's facts, gathered from the machine: the standard library, ``/proc``, ``/sys`` and
``/etc/os-release``; no program run.

- hostname: ``socket.gethostname()``; fqdn: ``socket.getfqdn()``, given at most two seconds (a
  resolver that does not answer leaves the hostname), and kept ten minutes;
- interfaces (``socket.if_nameindex()``, at most 64, sorted; not a container's ``veth*`` end):
  the IPv4 address of each, with its prefix, from the ``SIOCGIFADDR``/``SIOCGIFNETMASK`` ioctls
  (the interface's primary address, Ansible's ``ipv4``; secondary addresses without a label are
  not seen), and its IPv6 addresses from ``/proc/net/if_inet6`` (at most 16 each);
- the default IPv4 route from ``/proc/net/route``, the default IPv6 route from
  ``/proc/net/ipv6_route`` (the lowest metric; not through ``lo``): interface, gateway, and that
  interface's address;
- CPUs: ``os.sched_getaffinity(0)`` (those this agent may run on); memory: ``MemTotal`` of
  ``/proc/meminfo`` in MiB; the OS: ``ID``, ``VERSION_ID``, ``PRETTY_NAME`` of ``/etc/os-release``
  (else ``/usr/lib/os-release``).

A fact that cannot be read is left empty (a container without IPv6 has no ``if_inet6``): the
set is the same on every node, its values what the machine says. Gathered once per pass that
renders (``Resolver.facts``), and on an idle poll only when the slice running read them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
import threading
import time
from pathlib import Path

from reconciler.core.model.facts import MAX_ADDRESSES, MAX_FACT, MAX_INTERFACES, Facts, Route

SIOCGIFADDR = 0x8915
SIOCGIFNETMASK = 0x891B
# A container's end of its veth pair comes and goes with the container: not a fact of the node
# (each start would otherwise be a change of facts).
CONTAINER_ENDS = ("veth",)
FQDN_SECONDS = 2.0  # what a resolver is given to name this host
FQDN_KEPT = 600.0  # a name resolved is kept this long (seconds)
_fqdn_memo: dict[str, tuple[float, str]] = {}


def gather(proc: Path = Path("/proc"), etc: Path = Path("/etc")) -> Facts:
    """The facts of this machine (``proc``, ``etc``: where to read them, for a test's own tree)."""
    hostname = socket.gethostname()[:MAX_FACT]
    interfaces: dict[str, dict[str, tuple[str, ...]]] = {}
    v6 = _ipv6_addresses(proc)
    names = sorted(n for _, n in socket.if_nameindex() if not n.startswith(CONTAINER_ENDS))
    for name in names[:MAX_INTERFACES]:
        v4 = _ipv4_address(name)
        interfaces[name] = {"ipv4": (v4,) if v4 else (), "ipv6": tuple(v6.get(name, ()))[:MAX_ADDRESSES]}
    return Facts(hostname, fqdn(hostname), interfaces, _default_ipv4(proc, interfaces),
                 _default_ipv6(proc, interfaces), len(os.sched_getaffinity(0)), _memory_mb(proc), _os_release(etc))


def fqdn(hostname: str) -> str:
    """``socket.getfqdn()``, bounded in time (a thread that outlives it ends with its lookup)."""
    hit = _fqdn_memo.get(hostname)
    if hit is not None and time.monotonic() - hit[0] < FQDN_KEPT:
        return hit[1]
    found: list[str] = []
    worker = threading.Thread(target=lambda: found.append(socket.getfqdn(hostname)), daemon=True, name="fqdn")
    worker.start()
    worker.join(FQDN_SECONDS)
    name = (found[0] if found else hostname)[:MAX_FACT]
    _fqdn_memo[hostname] = (time.monotonic(), name)
    return name


def _ipv4_address(name: str) -> str:
    """The interface's primary IPv4 address as ``a.b.c.d/prefix``, or "" (none, or down)."""
    import fcntl  # Linux only, as the agent

    packed = struct.pack("256s", name.encode()[:15])
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFADDR, packed)[20:24])
            mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFNETMASK, packed)[20:24])
    except OSError:
        return ""
    return str(ipaddress.IPv4Interface(f"{addr}/{mask}"))


def _ipv6_addresses(proc: Path) -> dict[str, list[str]]:
    """Interface -> its IPv6 addresses (``addr/prefix``), as ``/proc/net/if_inet6`` lists them."""
    out: dict[str, list[str]] = {}
    for fields in _rows(proc / "net/if_inet6"):
        if len(fields) >= 6 and len(fields[0]) == 32:
            with contextlib.suppress(ValueError):
                addr = ipaddress.IPv6Address(bytes.fromhex(fields[0]))
                out.setdefault(fields[5], []).append(f"{addr}/{int(fields[2], 16)}")
    return out


def _default_ipv4(proc: Path, interfaces: dict[str, dict[str, tuple[str, ...]]]) -> Route | None:
    best: tuple[int, str, str] | None = None
    for fields in _rows(proc / "net/route")[1:]:
        with contextlib.suppress(ValueError, IndexError):
            if fields[1] == "00000000" and fields[7] == "00000000" and int(fields[3], 16) & 1:  # up, 0.0.0.0/0
                metric = int(fields[6])
                gateway = socket.inet_ntoa(struct.pack("<I", int(fields[2], 16)))
                if best is None or metric < best[0]:
                    best = (metric, fields[0], gateway)
    return _route(best, interfaces, "ipv4")


def _default_ipv6(proc: Path, interfaces: dict[str, dict[str, tuple[str, ...]]]) -> Route | None:
    best: tuple[int, str, str] | None = None
    for fields in _rows(proc / "net/ipv6_route"):
        with contextlib.suppress(ValueError, IndexError):
            if fields[0] == "0" * 32 and fields[1] == "00" and fields[9] != "lo":
                metric = int(fields[5], 16)
                gateway = str(ipaddress.IPv6Address(bytes.fromhex(fields[4])))
                if best is None or metric < best[0]:
                    best = (metric, fields[9], "" if gateway == "::" else gateway)
    return _route(best, interfaces, "ipv6")


def _route(best: tuple[int, str, str] | None, interfaces: dict[str, dict[str, tuple[str, ...]]],
           family: str) -> Route | None:
    if best is None:
        return None
    _, iface, gateway = best
    addresses = sorted(interfaces.get(iface, {}).get(family, ()),
                       key=lambda a: ipaddress.ip_interface(a).ip.is_link_local)
    return Route(iface[:MAX_FACT], gateway, addresses[0].split("/")[0] if addresses else "")


def _memory_mb(proc: Path) -> int:
    for fields in _rows(proc / "meminfo"):
        if fields[:1] == ["MemTotal:"] and len(fields) >= 2 and fields[1].isdigit():
            return int(fields[1]) // 1024
    return 0


def _os_release(etc: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for path in (etc / "os-release", Path("/usr/lib/os-release")):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() in ("ID", "VERSION_ID", "PRETTY_NAME"):
                values[key.strip().lower()] = value.strip().strip("\"'")[:MAX_FACT]
        break
    return {k: values.get(k, "") for k in ("id", "version_id", "pretty_name")}


def _rows(path: Path) -> list[list[str]]:
    try:
        return [line.split() for line in path.read_text(encoding="ascii", errors="replace").splitlines()]
    except OSError:
        return []
