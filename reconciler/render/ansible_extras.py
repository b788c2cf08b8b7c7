"""The rest of the Ansible dialect (see ``ansible_dialect``): the ``ipaddr`` family in the forms
kolla-ansible uses, kolla's own address filters, ``password_hash``/``bcrypt_hash`` and
``lookup('template', ...)``, and ``install``, which adds the dialect to a sandbox.

- ``ipaddr``/``ipv4``/``ipv6``/``ipwrap`` (ansible.utils, which is not ansible-core): the
  common queries (``address``, ``prefix``, ``network``, ``netmask``, ``broadcast``, ``host``,
  ``cidr``, ``net``, ``size``, ``private``, ``public``, ``revdns``) with the stdlib's
  ``ipaddress``; another query is an error, never a guess.
- ``kolla_address``: kolla's algorithm over ``hostvars``: ``<network>_interface``, then the
  interface's address in ``ansible_facts`` (the facts the node gathered, or for a review the
  ones it last published, docs/facts.md); an interface they do not name is read from the
  stand-in variable ``<interface>_address`` (``eth0_address``), else an error says so.
- ``password_hash`` (bcrypt only) and ``bcrypt_hash`` need a salt: Ansible's random one would
  render different bytes at every run, and every run would then rewrite the file and restart.
- ``lookup('template', NAME)``: one of this service's templates, through the sandbox's loader
  (never the disk, never ``..``), rendered with the caller's variables. Any other lookup reads
  the machine Ansible runs on, which a node's render must not: an error naming the lookup.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import string
from collections.abc import Callable, Mapping
from typing import Any

import jinja2

from reconciler.core.errors import RenderError
from reconciler.render.ansible_dialect import FILTERS, named_filters, refuse
from reconciler.render.ansible_tests import TESTS
from reconciler.render.kolla_filters import KOLLA_FILTERS
from reconciler.render.sandbox import Sandbox

Interface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


def _interface(value: Any) -> tuple[Interface, bool] | None:
    """The address (with its network) and whether a prefix was given, or None: not an address."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    try:
        return ipaddress.ip_interface(value), isinstance(value, str) and "/" in value
    except ValueError:
        return None


def _query(value: Any, query: str, iface: Interface, prefixed: bool) -> Any:
    net, ip = iface.network, iface.ip
    if query in ("", "address"):
        if query == "":
            return value
        return str(ip) if net.num_addresses == 1 or ip != net.network_address else False
    answers: dict[str, Callable[[], Any]] = {
        "prefix": lambda: net.prefixlen,
        "network": lambda: str(net.network_address),
        "netmask": lambda: str(net.netmask),
        "broadcast": lambda: str(net.broadcast_address),
        "host": lambda: (f"{ip}/{net.prefixlen}" if not prefixed or net.num_addresses == 1
                         or ip != net.network_address else False),
        "cidr": lambda: str(net), "subnet": lambda: str(net),
        "net": lambda: str(net) if net.num_addresses > 1 and ip == net.network_address else False,
        "size": lambda: net.num_addresses,
        "private": lambda: value if ip.is_private else False,
        "public": lambda: value if ip.is_global else False,
        "revdns": lambda: ip.reverse_pointer + ".",
    }
    if query not in answers:
        raise refuse("ipaddr", f"query {query!r} is not supported here ({', '.join(['address', *answers])})")
    return answers[query]()


def _ip_filter(name: str, version: int | None) -> Callable[..., Any]:
    def ip_filter(value: Any, query: str = "") -> Any:
        if isinstance(value, (list, tuple)):  # a list: the items that pass, transformed
            return [r for r in (ip_filter(v, query) for v in value) if r is not False]
        found = _interface(value)
        if found is None or (version is not None and found[0].version != version):
            return False
        return _query(value, str(query), *found)

    ip_filter.__name__ = name
    return ip_filter


def ipwrap(value: Any, query: str = "") -> Any:
    if isinstance(value, (list, tuple)):
        return [ipwrap(v, query) for v in value]
    found = _interface(value)
    if found is None or found[0].version != 6:
        return value
    iface, prefixed = found
    return f"[{iface.ip}]/{iface.network.prefixlen}" if prefixed else f"[{iface.ip}]"


def put_address_in_context(address: str, context: str) -> str:
    """kolla's: an IPv6 address as a URL, memcached or RabbitMQ (Erlang) configuration wants it."""
    if context not in ("url", "memcache", "rabbitmq"):
        raise refuse("put_address_in_context", f"unknown context {context!r} (url, memcache, rabbitmq)")
    if ":" not in address and context != "rabbitmq":
        return address
    if context == "url":
        return f"[{address}]"
    if context == "memcache":
        return f"inet6:[{address}]"
    ip = ipaddress.ip_address(address)
    if ip.version == 6:
        return ",".join(f"16#{int(x, 16):x}" for x in ip.exploded.split(":"))
    return address.replace(".", ",")


def kolla_url(fqdn: str, protocol: str, port: Any, path: str = "", context: str = "url") -> str:
    host, port = put_address_in_context(fqdn, context), int(port)
    default = (protocol in ("http", "ws") and port == 80) or (protocol in ("https", "wss") and port == 443)
    return f"{protocol}://{host}{path}" if default else f"{protocol}://{host}:{port}{path}"


@jinja2.pass_context
def kolla_address(ctx: jinja2.runtime.Context, network: str, hostname: str | None = None,
                  override_var: str | None = None) -> str:
    hostname = hostname or str(ctx.get("inventory_hostname"))
    host = (ctx.get("hostvars") or {}).get(hostname)
    if not isinstance(host, Mapping):
        raise refuse("kolla_address", f"{hostname!r} not in hostvars")
    if override_var is not None and override_var in host:
        try:
            return str(ipaddress.ip_address(host[override_var]))
        except ValueError:
            raise refuse("kolla_address", f"variable {override_var!r} of node {hostname!r} is "
                         f"{host[override_var]!r}, not an IPv4 or IPv6 address") from None
    iface = host.get(f"{network}_interface")
    if iface is None:
        raise refuse("kolla_address", f"no interface for network {network!r} (set '{network}_interface')")
    family = str(host.get(f"{network}_address_family", "ipv4")).lower()
    if family not in ("ipv4", "ipv6"):
        raise refuse("kolla_address", f"unknown address family {family!r} for network {network!r}")
    facts = host.get("ansible_facts")
    found = facts.get(str(iface).replace("-", "_")) if isinstance(facts, Mapping) else None
    if isinstance(found, Mapping):
        return _fact_address(found, family, iface, hostname)
    stand_in = f"{str(iface).replace('-', '_')}_address"
    if stand_in not in host:
        raise refuse("kolla_address", f"the address of {network}_interface {iface!r} on node {hostname!r} is not "
                     f"known: its facts name no such interface; set the inventory variable {stand_in!r} "
                     "(or check the interface's name)")
    try:
        ip = ipaddress.ip_address(str(host[stand_in]))
    except ValueError:
        raise refuse("kolla_address", f"{stand_in} of node {hostname!r} is not an address: "
                     f"{host[stand_in]!r}") from None
    if f"ipv{ip.version}" != family:
        raise refuse("kolla_address", f"{stand_in} of node {hostname!r} is not an {family} address")
    return str(ip)


def _fact_address(facts: Mapping[str, Any], family: str, iface: str, hostname: str) -> str:
    """kolla's choice among an interface's addresses in Ansible's facts."""
    found = facts.get(family)
    if not found:
        raise refuse("kolla_address", f"no {family} address on interface {iface!r} of node {hostname!r}")
    if family == "ipv4":
        address = str(found.get("address") if isinstance(found, Mapping) else found)
        if ipaddress.ip_address(address).is_loopback:  # an address for BGP put on lo: its secondary
            others = [str(s.get("address")) for s in facts.get("ipv4_secondaries", ()) if isinstance(s, Mapping)
                      and not ipaddress.ip_address(str(s.get("address"))).is_loopback]
            address = others[0] if others else address
        return address
    globals_ = [str(a["address"]) for a in found if isinstance(a, Mapping) and a.get("scope") == "global"]
    if not globals_:
        raise refuse("kolla_address", f"no global ipv6 address on interface {iface!r} of node {hostname!r}")
    return globals_[0]


_B64 = string.ascii_uppercase + string.ascii_lowercase + string.digits + "+/"
_BCRYPT64 = "./" + string.ascii_uppercase + string.ascii_lowercase + string.digits


_ROUNDS = (4, 14)


def _bcrypt(password: str, salt22: str, rounds: int = 12, ident: str = "2b") -> str:
    import bcrypt  # a dependency, imported only by a template that hashes

    setting = f"${ident}${int(rounds):02d}${salt22}".encode()
    return bcrypt.hashpw(password.encode("utf-8"), setting).decode("ascii")


def password_hash(password: Any, hashtype: str = "sha512", salt: str | None = None, salt_size: int | None = None,
                  rounds: int | None = None, ident: str | None = None) -> str:
    if hashtype not in ("bcrypt", "blowfish"):
        raise refuse("password_hash", f"hash type {hashtype!r} is not supported here (bcrypt)")
    if not salt:
        raise refuse("password_hash", "needs a salt (22 characters of ./A-Za-z0-9): a random one would "
                     "change the file at every render")
    try:
        cost = 12 if rounds is None else int(rounds)
    except (TypeError, ValueError):
        cost = -1
    # Each round more doubles bcrypt's time, in one C call no deadline can stop: 14 is about a
    # second, 31 some 36 hours. 4 is bcrypt's own least.
    if isinstance(rounds, bool) or not _ROUNDS[0] <= cost <= _ROUNDS[1]:
        raise refuse("password_hash", f"rounds must be between {_ROUNDS[0]} and {_ROUNDS[1]}, got {rounds!r}")
    return _bcrypt(str(password), str(salt), cost, ident or "2b")


def bcrypt_hash(password: Any, salt: str | None = None) -> str:
    """kolla's: the salt is any string, its SHA-256 made into bcrypt's alphabet."""
    if not salt:
        raise refuse("bcrypt_hash", "needs a salt: a random one would change the file at every render")
    raw = base64.b64encode(hashlib.sha256(str(salt).encode("utf-8")).digest()[:16]).decode("ascii")
    return _bcrypt(str(password), raw.translate(str.maketrans(_B64, _BCRYPT64))[:22])


def _vars(ctx: jinja2.runtime.Context, terms: tuple[Any, ...], wantlist: bool, options: dict[str, Any]) -> Any:
    """``lookup('vars', NAME, default=...)``: a variable of the render by a computed name (kolla
    picks ``run_default_volumes_<engine>`` so), read through the context (a templated value is
    rendered). The review's inputs count a value calling it as reading every variable."""
    if set(options) - {"default"}:
        raise refuse("lookup('vars')", f"option {sorted(set(options) - {'default'})[0]!r} is not supported")
    out = []
    for term in terms:
        name = str(term)
        # The context holds more than variables, under names no template can write (the lazy
        # variables' resolver, whose cache has secret-derived values without their mark).
        if not name.isidentifier() or name.startswith("_"):
            raise refuse("lookup('vars')", f"{name!r} is not a variable's name")
        value = ctx.resolve_or_missing(name)
        if value is jinja2.utils.missing or isinstance(value, jinja2.Undefined):
            if "default" not in options:
                raise refuse("lookup('vars')", f"no variable {name!r}")
            value = options["default"]
        out.append(value)
    if wantlist:
        return out
    return out[0] if len(out) == 1 else ",".join(str(v) for v in out)


@jinja2.pass_context
def lookup(ctx: jinja2.runtime.Context, kind: str, *terms: Any, wantlist: bool = False, **options: Any) -> Any:
    if kind in ("vars", "ansible.builtin.vars"):
        return _vars(ctx, terms, wantlist, options)
    if kind not in ("template", "ansible.builtin.template"):
        raise RenderError(f"lookup({kind!r}) is not available: a node renders from the repo alone "
                          "(only lookup('template', NAME) of this service's templates, lookup('vars', NAME))")
    if options:
        raise refuse("lookup('template')", f"option {sorted(options)[0]!r} is not supported")
    env = ctx.environment
    out = []
    for term in terms:
        tpl = env.get_template(str(term))  # the repo's loader: no ``..``, no absolute path, no disk
        sub = tpl.new_context(ctx.get_all(), shared=True)
        out.append(env.concat(tpl.root_render_func(sub)))  # type: ignore[attr-defined]
    return out if wantlist else ",".join(out)


@jinja2.pass_context
def query(ctx: jinja2.runtime.Context, kind: str, *terms: Any, **options: Any) -> Any:
    return lookup(ctx, kind, *terms, wantlist=True, **options)


EXTRA_FILTERS: dict[str, Callable[..., Any]] = {
    "password_hash": password_hash, "put_address_in_context": put_address_in_context, "kolla_url": kolla_url,
    "kolla_address": kolla_address, "bcrypt_hash": bcrypt_hash,
}
IP_FILTERS: dict[str, Callable[..., Any]] = {
    "ipaddr": _ip_filter("ipaddr", None), "ipv4": _ip_filter("ipv4", 4), "ipv6": _ip_filter("ipv6", 6),
    "ipwrap": ipwrap,
}


def install(env: Sandbox) -> None:
    """Add the dialect to a service's sandbox (each filter paced like Jinja's own)."""
    # Ansible renders templates and variables with trim_blocks (the template module's default,
    # and its templar's): the newline after a block tag is dropped, as kolla's templates expect
    # (`}{% endif %}` then `],` on the next line gives `}    ],`). Set before anything compiles.
    env.trim_blocks = True
    env.add_filters({**named_filters(FILTERS, "ansible.builtin"), **named_filters(IP_FILTERS, "ansible.utils"),
                     **named_filters(EXTRA_FILTERS, None), **named_filters(KOLLA_FILTERS, None)})
    env.add_tests(named_filters(TESTS, "ansible.builtin"))
    env.globals.update({"lookup": lookup, "query": query, "q": query})
