"""Reading the agent's settings: a YAML file on the node (``--config``), flags override, and a
clear error for each problem, all at once, each with its file and line (``problems``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from reconciler.core.errors import ConfigError
from reconciler.core.yamlfile import load_yaml, near
from reconciler.settings.agent import (
    POLICIES,
    AgentConfig,
    HostConfig,
    SecretsConfig,
    TrustConfig,
)
from reconciler.settings.problems import FLAGS, At, Problems, name_of
from reconciler.settings.remoteurl import remote_url, remotes
from reconciler.settings.sections import WEEK, argv, docker, mapping, metrics, notify, number, path, receiver


def load_config(path_: Path | None, overrides: dict[str, Any],
                node_of: Callable[[Path], str | None] | None = None) -> AgentConfig:
    """Settings from ``path_`` (if any), then non-None ``overrides``. Every problem is said at
    once, each at the line of the setting it names: each check tells a ``Problems`` and goes on.
    ``node_of``: for a command on an existing state dir, the node it names (read when neither
    the file nor the flags name one)."""
    values: dict[str, Any] = {}
    doc = None
    if path_ is not None:
        try:
            raw = path_.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read agent config: {exc.strerror}", file=str(path_)) from exc
        doc = load_yaml(raw, str(path_))
        if doc.data is not None and not isinstance(doc.data, dict):
            raise ConfigError("agent config must be a mapping", file=str(path_), line=1)
        known = {f.name for f in fields(AgentConfig)}  # another key: said by Problems, with the name meant
        values = {key: v for k, v in (doc.data or {}).items() if (key := str(k).replace("-", "_")) in known}
    p = Problems(str(path_) if path_ is not None else FLAGS, doc)
    flags = {k: v for k, v in overrides.items() if v is not None}
    trust = _trust(values.pop("trust", None), {k: flags.pop(f"trust_{k}") for k in TRUST_FLAGS
                                               if f"trust_{k}" in flags}, p)
    secrets = _secrets(values.pop("secrets", None), flags.pop("secrets_age_identity", None), p)
    host = _host(values.pop("host", None), p)
    metrics_ = metrics(values.pop("metrics", None), flags.pop("metrics_textfile", None), p)
    receiver_ = receiver(values.pop("receiver", None), p)
    notify_, remotes_, docker_ = (notify(values.pop("notify", None), p), remotes(values.pop("remotes", None), p),
                                  docker(values.pop("docker", None), p))
    values.update(flags)

    def seconds(key: str, default: float, *, zero: bool = False, most: float = WEEK) -> float:
        return number(values.get(key, default), (key,), p, zero=zero, most=most, flag=key in flags)

    def add(key: str, message: str) -> None:
        p.add((key,), message, flag=key in flags)
    for key in ("branch", "state_dir", "ssh_command"):
        if key in values and values[key] is not None and not isinstance(values[key], str | Path):
            add(key, f"{key} must be a string")
        elif key in values and values[key] is None and key != "ssh_command":
            add(key, f"{key} must not be empty")
        else:
            continue
        values.pop(key)
        if key == "state_dir":
            node_of = None  # not the default state dir's node: the one this file meant is unknown
    state_dir = Path(str(values.get("state_dir", "/var/lib/reconciler"))).expanduser()
    if not values.get("node") and node_of is not None:
        values["node"] = node_of(state_dir)
    remote = values.get("remote")
    if remote:
        remote = remote_url(str(remote), p, ("remote",), flag="remote" in flags)
    elif remotes_:  # from remotes, checked there: the write remote (or the first read one)
        remote = next((r.url for r in remotes_ if r.writes), remotes_[0].url)
    for required, given in (("node", values.get("node")), ("remote", remote)):
        if not given:
            p.add((), f"missing setting {required!r} (give --{required} or set it in --config)")
    if values.get("node") and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", str(values["node"])):
        add("node", f"node name {values['node']!r} must be letters, digits, '.', '_' or '-'")
    interval, jitter = seconds("interval", 60.0), seconds("jitter", 10.0, zero=True)
    supervise, free = seconds("supervise_interval", 2.0), seconds("min_free_mb", 16.0, zero=True, most=float(1 << 40))
    wait_poll = seconds("wait_poll", 1.0, zero=True)
    note_key = path(values.get("note_key"), ("note_key",), p, flag="note_key" in flags)
    parallel = values.get("max_parallel", 8)
    if isinstance(parallel, bool) or not isinstance(parallel, int) or not 1 <= parallel <= MOST_PARALLEL:
        add("max_parallel", f"max_parallel: {parallel!r} must be a whole number from 1 to {MOST_PARALLEL}")
        parallel = 1
    p.done()
    try:
        return AgentConfig(
            node=str(values["node"]), remote=str(remote), branch=str(values.get("branch", "main")),
            state_dir=state_dir, interval=interval, jitter=jitter, supervise_interval=supervise, wait_poll=wait_poll,
            min_free_mb=free, max_parallel=parallel, ssh_command=values.get("ssh_command"), note_key=note_key,
            trust=trust, host=host, metrics=metrics_, notify=notify_, secrets=secrets, remotes=remotes_,
            docker=docker_, receiver=receiver_)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"bad setting: {exc}", file=p.file) from exc


MOST_PARALLEL = 256  # a thread each while they hold: more would be a typo, not a node

TRUST_FLAGS = ("allowed_signers", "gpg_home", "revoked", "policy", "sealers", "require_branch_binding")


def _trust(value: Any, flags: dict[str, Any], p: Problems) -> TrustConfig:
    """The trust root's settings: the file's, each flag given in its place."""
    t = {**mapping(value, ("trust",), p, tuple(f.name for f in fields(TrustConfig))), **flags}
    binding = t.get("require_branch_binding", False)
    if not isinstance(binding, bool):
        p.add(("trust", "require_branch_binding"), "trust.require_branch_binding must be true or false",
              flag="require_branch_binding" in flags)
    policy = str(t.get("policy", "every-commit"))
    if policy not in POLICIES:
        p.add(("trust", "policy"), f"trust.policy: {policy!r} is not one of {', '.join(POLICIES)}"
              f"{near(policy, POLICIES)}", flag="policy" in flags)

    def file(key: str) -> Path | None:
        return path(t.get(key), ("trust", key), p, flag=key in flags)
    return TrustConfig(allowed_signers=file("allowed_signers"), gpg_home=file("gpg_home"), revoked=file("revoked"),
                       policy=policy, sealers=file("sealers"), require_branch_binding=binding is True)


def _host(value: Any, p: Problems) -> HostConfig:
    """How the agent reaches the node's own OS: paths, commands (a string or a list of words)."""
    h = mapping(value, ("host",), p, tuple(f.name for f in fields(HostConfig)))

    def text(key: str, default: str) -> str:
        found = h.get(key, default)
        if not isinstance(found, str | Path) or not str(found):
            p.add(("host", key), f"{name_of(('host', key))}: {found!r} must be {_WANTS[key]}")
            return default
        return str(found)
    return HostConfig(root=Path(text("root", "/")), systemctl=argv(h.get("systemctl", ["systemctl"]),
                                                                     ("host", "systemctl"), p),
                      exec=argv(h.get("exec", []), ("host", "exec"), p),
                      reboot_command=text("reboot_command", "systemctl reboot"),
                      boot_id_file=Path(text("boot_id_file", "/proc/sys/kernel/random/boot_id")))


_WANTS = {"root": "a directory", "reboot_command": "a command", "boot_id_file": "a file path"}


def _secrets(value: Any, flag: Any, p: Problems) -> SecretsConfig:
    """How this node reads the repo's SOPS files: its age identity (the flag's, given one)."""
    at: At = ("secrets", "age_identity")
    if value is not None and not isinstance(value, dict):
        p.add(("secrets",), "secrets: a mapping with age_identity (the node's age key file)")
        value = None
    written = mapping(value, ("secrets",), p, ("age_identity",)).get("age_identity")
    return SecretsConfig(path(flag, at, p, flag=True) if flag is not None else path(written, at, p))
