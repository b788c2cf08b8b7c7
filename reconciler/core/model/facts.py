"""A node's facts: the small, stated set the agent gathers about the machine it runs on, and
what templates see of them (``facts``, and ``ansible_facts`` in the Ansible dialect).

The set, and only it: hostname, fqdn, each interface's IPv4 and IPv6 addresses (with their
prefix length), the default IPv4 and IPv6 routes (interface, gateway, the interface's address),
the CPUs the agent may run on, the memory in MiB, and the OS release (``ID``, ``VERSION_ID``,
``PRETTY_NAME`` of ``/etc/os-release``). ``node.facts`` gathers them; a node publishes them in
its note (``fleet.notes``), and a reviewer's render reads them back from there
(``Facts.from_dict``, which refuses what is out of bounds: a note is another machine's input).

Pure: data in, data out.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_INTERFACES = 64  # interfaces a node publishes (and a reader accepts)
MAX_ADDRESSES = 16  # addresses per interface and family
MAX_FACT = 253  # characters of one fact: a DNS name at most

# Ansible's ``distribution`` for the common os-release IDs (anything else: the ID, capitalised)
_DISTRIBUTIONS = {"ubuntu": "Ubuntu", "debian": "Debian", "centos": "CentOS", "rocky": "Rocky", "rhel": "RedHat",
                  "fedora": "Fedora", "almalinux": "AlmaLinux", "ol": "OracleLinux", "opensuse-leap": "openSUSE Leap",
                  "sles": "SLES", "alpine": "Alpine", "arch": "Archlinux"}
_FAMILIES = {"ubuntu": "Debian", "debian": "Debian", "centos": "RedHat", "rocky": "RedHat", "rhel": "RedHat",
             "fedora": "RedHat", "almalinux": "RedHat", "ol": "RedHat", "opensuse-leap": "Suse", "sles": "Suse",
             "alpine": "Alpine", "arch": "Archlinux"}


class BadFacts(ValueError):
    """Facts that are not within bounds or not of the stated shape (a reader counts them as none)."""


@dataclass(frozen=True)
class Route:
    """A default route: through ``interface`` (and ``gateway``), from the interface's ``address``."""

    interface: str
    gateway: str = ""
    address: str = ""


@dataclass(frozen=True)
class Facts:
    hostname: str
    fqdn: str
    interfaces: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)  # name -> ipv4/ipv6 -> "a/p"
    default_ipv4: Route | None = None
    default_ipv6: Route | None = None
    cpus: int = 0
    memory_mb: int = 0
    os: Mapping[str, str] = field(default_factory=dict)  # id, version_id, pretty_name

    def to_dict(self) -> dict[str, Any]:
        """As a note holds them (and ``from_dict`` reads back): plain JSON, sorted by name."""
        out: dict[str, Any] = {
            "hostname": self.hostname, "fqdn": self.fqdn, "cpus": self.cpus, "memory_mb": self.memory_mb,
            "os": dict(sorted(self.os.items())),
            "interfaces": {n: {"ipv4": list(a.get("ipv4", ())), "ipv6": list(a.get("ipv6", ()))}
                           for n, a in sorted(self.interfaces.items())},
        }
        for key, route in (("default_ipv4", self.default_ipv4), ("default_ipv6", self.default_ipv6)):
            if route is not None:
                out[key] = {"interface": route.interface, "gateway": route.gateway, "address": route.address}
        return out

    @staticmethod
    def from_dict(data: Any) -> Facts:
        """Facts as a note holds them, checked: ``BadFacts`` for anything else."""
        if not isinstance(data, Mapping):
            raise BadFacts("facts: not an object")
        ifaces = data.get("interfaces", {})
        if not isinstance(ifaces, Mapping) or len(ifaces) > MAX_INTERFACES:
            raise BadFacts(f"facts.interfaces: not an object of at most {MAX_INTERFACES} interfaces")
        interfaces = {_text(n, "interface"): {fam: _addresses(a, fam, n) for fam in ("ipv4", "ipv6")}
                      for n, a in ifaces.items() if _is_object(a, n)}
        os_release = data.get("os", {})
        if not isinstance(os_release, Mapping):
            raise BadFacts("facts.os: not an object")
        return Facts(_text(data.get("hostname"), "hostname"), _text(data.get("fqdn"), "fqdn"), interfaces,
                     _route(data.get("default_ipv4")), _route(data.get("default_ipv6")),
                     _count(data.get("cpus", 0), "cpus"), _count(data.get("memory_mb", 0), "memory_mb"),
                     {k: _text(os_release.get(k, ""), f"os.{k}") for k in ("id", "version_id", "pretty_name")})

    def first(self, iface: str, family: str) -> str:
        """The interface's first address of ``family`` without its prefix (IPv6: a global one
        first), or ""."""
        found = list(self.interfaces.get(iface, {}).get(family, ()))
        if family == "ipv6":
            found.sort(key=lambda a: ipaddress.ip_interface(a).ip.is_link_local)
        return found[0].split("/")[0] if found else ""

    def template(self) -> dict[str, Any]:
        """``facts`` in a template."""
        return {
            "hostname": self.hostname, "fqdn": self.fqdn, "cpus": self.cpus, "memory_mb": self.memory_mb,
            "os": dict(self.os),
            "interfaces": {n: {"ipv4": self.first(n, "ipv4"), "ipv6": self.first(n, "ipv6"),
                               "ipv4_addresses": list(a.get("ipv4", ())), "ipv6_addresses": list(a.get("ipv6", ()))}
                           for n, a in self.interfaces.items()},
            "default_ipv4": _route_dict(self.default_ipv4), "default_ipv6": _route_dict(self.default_ipv6),
        }

    def ansible(self) -> dict[str, Any]:
        """``ansible_facts`` in the Ansible dialect: shaped as Ansible's setup module's, for what
        kolla-ansible reads (an interface under its name with ``-`` as ``_``)."""
        os_id = self.os.get("id", "")
        version = self.os.get("version_id", "")
        out: dict[str, Any] = {
            "hostname": self.hostname.split(".")[0], "nodename": self.hostname, "fqdn": self.fqdn,
            "processor_vcpus": self.cpus, "memtotal_mb": self.memory_mb,
            "distribution": _DISTRIBUTIONS.get(os_id, os_id.capitalize()), "distribution_version": version,
            "distribution_major_version": version.split(".")[0], "os_family": _FAMILIES.get(os_id, os_id.capitalize()),
            "interfaces": sorted(self.interfaces),
            "default_ipv4": _route_dict(self.default_ipv4), "default_ipv6": _route_dict(self.default_ipv6),
        }
        for name, addrs in self.interfaces.items():
            v4 = [_ipv4(a) for a in addrs.get("ipv4", ())]
            entry: dict[str, Any] = {"device": name, "ipv6": [_ipv6(a) for a in addrs.get("ipv6", ())]}
            if v4:
                entry["ipv4"], entry["ipv4_secondaries"] = v4[0], v4[1:]
            out[name.replace("-", "_")] = entry
        return out


def changes(old: Facts | None, new: Facts, reads: Collection[str] | None = None) -> list[str]:
    """What differs, one line each: ``eth0 ipv4 10.0.0.5/24 -> 10.0.0.6/24``; of what a render
    read only (``reads``, what ``subjects`` named; None: all, for a render whose reads are not
    known)."""
    if old is None:
        return []
    a, b = _flat(old), _flat(new)
    appeared = set(old.interfaces) ^ set(new.interfaces)
    return [f"{k} {a.get(k, '(none)') or '(none)'} -> {b.get(k, '(none)') or '(none)'}"
            for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
            and (reads is None or ALL in reads or _subject_read(k, reads, appeared))]


# What a template read of the facts, as ``subjects`` names it and ``changes`` compares it: the
# keys of ``_flat`` (``os`` for all of ``os``), "if NAME" for an interface's addresses (NAME as
# the template asked for it: Ansible's has "-" as "_"), "interfaces" for which there are, "*"
# for all (a template that went through every fact).
ALL, INTERFACES = "*", "interfaces"
_ANSIBLE = {"hostname": "hostname", "nodename": "hostname", "fqdn": "fqdn", "processor_vcpus": "cpus",
            "memtotal_mb": "memory_mb", "distribution": "os", "distribution_version": "os",
            "distribution_major_version": "os", "os_family": "os", "interfaces": INTERFACES}


def subjects(facts: Facts, key: str, view: str = "facts") -> tuple[str, ...]:
    """What reading ``key`` of ``facts`` in a template reads: of ``facts.template()`` (``view``
    "facts"; its interfaces are read one by one, as "if NAME") or of ``facts.ansible()``
    ("ansible_facts")."""
    if key in ("default_ipv4", "default_ipv6"):
        route = facts.default_ipv4 if key == "default_ipv4" else facts.default_ipv6
        # the route's address is its interface's: read with it
        return (f"default {key[-4:]}", *((f"if {route.interface}",) if route else ()))
    if view == "facts":
        return (key,) if key in ("hostname", "fqdn", "cpus", "memory_mb", "os") else ()
    return (_ANSIBLE[key],) if key in _ANSIBLE else (f"if {key}",)  # any other key: an interface's


def _subject_read(key: str, reads: Collection[str], appeared: set[str]) -> bool:
    if key in reads or (key.startswith("os ") and "os" in reads):
        return True
    name, _, family = key.rpartition(" ")
    if family not in ("ipv4", "ipv6") or name in ("default", "os"):
        return False
    return (f"if {name}" in reads or f"if {name.replace('-', '_')}" in reads
            or (INTERFACES in reads and name in appeared))


def _flat(facts: Facts) -> dict[str, str]:
    out = {"hostname": facts.hostname, "fqdn": facts.fqdn, "cpus": str(facts.cpus),
           "memory_mb": str(facts.memory_mb), **{f"os {k}": v for k, v in facts.os.items()}}
    for name, addrs in facts.interfaces.items():
        for fam in ("ipv4", "ipv6"):
            out[f"{name} {fam}"] = " ".join(addrs.get(fam, ()))
    for fam, route in (("ipv4", facts.default_ipv4), ("ipv6", facts.default_ipv6)):
        out[f"default {fam}"] = f"{route.interface} via {route.gateway or '-'}" if route else ""
    return out


def _route_dict(route: Route | None) -> dict[str, str]:
    return {"interface": route.interface, "gateway": route.gateway, "address": route.address} if route else {}


def _ipv4(text: str) -> dict[str, Any]:
    iface = ipaddress.IPv4Interface(text)
    return {"address": str(iface.ip), "netmask": str(iface.netmask), "network": str(iface.network.network_address),
            "prefix": str(iface.network.prefixlen), "broadcast": str(iface.network.broadcast_address)}


def _ipv6(text: str) -> dict[str, Any]:
    iface = ipaddress.IPv6Interface(text)
    scope = "link" if iface.ip.is_link_local else "host" if iface.ip.is_loopback else "global"
    return {"address": str(iface.ip), "prefix": str(iface.network.prefixlen), "scope": scope}


def _is_object(value: Any, name: Any) -> bool:
    if not isinstance(value, Mapping):
        raise BadFacts(f"facts.interfaces.{str(name)[:32]}: not an object")
    return True


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_FACT:
        raise BadFacts(f"facts.{what}: not a string of at most {MAX_FACT} characters")
    return value


def _count(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**40:
        raise BadFacts(f"facts.{what}: not a count")
    return value


def _addresses(entry: Mapping[str, Any], family: str, iface: str) -> tuple[str, ...]:
    values = entry.get(family, [])
    if not isinstance(values, list) or len(values) > MAX_ADDRESSES:
        raise BadFacts(f"facts.interfaces.{iface[:32]}.{family}: not a list of at most {MAX_ADDRESSES} addresses")
    kind = ipaddress.IPv4Interface if family == "ipv4" else ipaddress.IPv6Interface
    for v in values:
        try:
            kind(_text(v, f"interfaces.{iface[:32]}.{family}"))
        except ValueError as exc:
            raise BadFacts(f"facts.interfaces.{iface[:32]}.{family}: {str(v)[:64]!r} is not an address") from exc
    return tuple(values)


def _route(value: Any) -> Route | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise BadFacts("facts.default route: not an object")
    return Route(_text(value.get("interface", ""), "route interface"), _text(value.get("gateway", ""), "gateway"),
                 _text(value.get("address", ""), "route address"))
