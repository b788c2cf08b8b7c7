"""The node's facts, gathered from the machine: the standard library, ``/proc``, ``/sys`` and
``/etc/os-release``; no program run.

- hostname: ``socket.gethostname()``; fqdn: ``socket.getfqdn()``, given at most two seconds,
  and an answer kept ten minutes (a resolver that does not answer leaves the last answer, else
  the hostname; one lookup at a time);
- interfaces (``socket.if_nameindex()``, at most 64, sorted; not the devices made per container,
  VM port or router: ``veth*``, Neutron's ``tap``/``qvb``/``qvo``/``qbr``/``qr-``/``qg-`` + a port
  id, docker's ``br-`` + a network id): the IPv4 address of each, with its prefix, from the
  ``SIOCGIFADDR``/``SIOCGIFNETMASK`` ioctls (the interface's primary address, Ansible's
  ``ipv4``; secondary addresses without a label are not seen), and its IPv6 addresses from
  ``/proc/net/if_inet6`` (at most 16 each; not a temporary, deprecated, tentative or
  DAD-failed one);
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
import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from reconciler.core.model.facts import MAX_ADDRESSES, MAX_FACT, MAX_INTERFACES, Facts, Route

SIOCGIFADDR = 0x8915
SIOCGIFNETMASK = 0x891B
# Devices made per container, VM port or router come and go with them: not facts of the node.
# Left out because a compute node has hundreds (four per VM with the hybrid firewall), which
# would push its real interfaces past the 64 kept, and fill every note. Matched on the name the
# tool derives from an id (Neutron: a prefix and the port's id cut to 11 characters; docker: br-
# and 12 hex digits), so an interface an operator named (an OVS br-ex, a tun0, a vxlan) stays.
CHURN = re.compile(r"veth.*|(tap|qvb|qvo|qbr|qr-|qg-)[0-9a-f]{8}-[0-9a-f]{2}|br-[0-9a-f]{12}")
# /proc/net/if_inet6 flags of an address not to publish: temporary (a privacy address, rotated
# daily), DAD failed, deprecated (on its way out), tentative (not usable yet). Not 0x80,
# permanent: that is a static address.
IFA_F_TEMPORARY, IFA_F_DADFAILED, IFA_F_DEPRECATED, IFA_F_TENTATIVE = 0x01, 0x08, 0x20, 0x40
PASSING = IFA_F_TEMPORARY | IFA_F_DADFAILED | IFA_F_DEPRECATED | IFA_F_TENTATIVE
FQDN_SECONDS = 2.0  # what a resolver is given to name this host
FQDN_KEPT = 600.0  # an answer is kept this long (seconds)
_fqdn_lock = threading.Lock()
_fqdn_known: dict[str, tuple[float, str]] = {}  # hostname -> (when answered, the answer)
_fqdn_asking: set[str] = set()  # hostnames whose lookup is still running


def gather(proc: Path = Path("/proc"), etc: Path = Path("/etc")) -> Facts:
    """The facts of this machine (``proc``, ``etc``: where to read them, for a test's own tree)."""
    hostname = socket.gethostname()[:MAX_FACT]
    interfaces: dict[str, dict[str, tuple[str, ...]]] = {}
    v6 = _ipv6_addresses(proc)
    names = sorted(n for _, n in socket.if_nameindex() if not CHURN.fullmatch(n))
    for name in names[:MAX_INTERFACES]:
        v4 = _ipv4_address(name)
        interfaces[name] = {"ipv4": (v4,) if v4 else (), "ipv6": tuple(v6.get(name, ()))[:MAX_ADDRESSES]}
    return Facts(hostname, fqdn(hostname), interfaces, _default_ipv4(proc, interfaces),
                 _default_ipv6(proc, interfaces), len(os.sched_getaffinity(0)), _memory_mb(proc), _os_release(etc))


def fqdn(hostname: str, look_up: Callable[[str], str] = socket.getfqdn) -> str:
    """``look_up(hostname)`` (``socket.getfqdn``), bounded in time: an answer is kept ten
    minutes; a lookup that does not answer in time leaves the last answer (else the hostname),
    so a resolver that is down for a while changes no fact, and templates reading the fqdn do
    not restart twice. A lookup still running (a hung NSS module) is not started again nor
    waited for: its answer, when it comes, is kept for the next pass."""
    with _fqdn_lock:
        known = _fqdn_known.get(hostname)
        if known is not None and time.monotonic() - known[0] < FQDN_KEPT:
            return known[1]
        worker: threading.Thread | None = None
        if hostname not in _fqdn_asking:
            _fqdn_asking.add(hostname)
            worker = threading.Thread(target=_ask, args=(hostname, look_up), daemon=True, name="fqdn")
            try:
                worker.start()
            except RuntimeError:  # no thread to be had: no lookup this time
                _fqdn_asking.discard(hostname)
                worker = None
    if worker is not None:
        worker.join(FQDN_SECONDS)
    with _fqdn_lock:
        known = _fqdn_known.get(hostname)
    return known[1] if known is not None else hostname


def _ask(hostname: str, look_up: Callable[[str], str]) -> None:
    try:
        name = look_up(hostname)[:MAX_FACT]
        with _fqdn_lock:
            _fqdn_known[hostname] = (time.monotonic(), name)
    finally:
        with _fqdn_lock:
            _fqdn_asking.discard(hostname)


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
    try:
        return if_inet6((proc / "net/if_inet6").read_text(encoding="ascii", errors="replace"))
    except OSError:
        return {}


def if_inet6(text: str) -> dict[str, list[str]]:
    """Interface -> its IPv6 addresses (``addr/prefix``), from the text of ``/proc/net/if_inet6``
    (``address ifindex prefix scope flags name``): those an address is picked from, not a
    temporary, deprecated, tentative or DAD-failed one (``PASSING``)."""
    out: dict[str, list[str]] = {}
    for fields in (line.split() for line in text.splitlines()):
        if len(fields) >= 6 and len(fields[0]) == 32:
            with contextlib.suppress(ValueError):
                if int(fields[4], 16) & PASSING:
                    continue
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
