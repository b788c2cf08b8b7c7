"""Reading the agent's settings: a YAML file on the node (``--config``), flags override, and a
clear error, with its file and line where known, for each problem (``ConfigError``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from reconciler.core.errors import ConfigError
from reconciler.core.yamlfile import load_yaml
from reconciler.drivers.registry import ENV_NAME, RegistryLogin
from reconciler.settings.agent import (
    POLICIES,
    ROLES,
    AgentConfig,
    DockerConfig,
    HostConfig,
    MetricsConfig,
    NotifyConfig,
    RemoteConfig,
    SecretsConfig,
    TrustConfig,
    WebhookConfig,
)


def load_config(path: Path | None, overrides: dict[str, Any],
                node_of: Callable[[Path], str | None] | None = None) -> AgentConfig:
    """Settings from ``path`` (if any), then non-None ``overrides``; clear errors for each problem.
    ``node_of``: for a command on an existing state dir, the node it names (read when neither
    the file nor the flags name one). A file with mistakes has them all said at once (``problems``)."""
    try:
        return _load_config(path, overrides, node_of)
    except ConfigError as exc:
        if path is None:
            raise
        from reconciler.settings.problems import every_problem

        file = str(path)
        raise every_problem(exc, path, {
            "metrics": lambda v: _metrics(v, None, file), "notify": lambda v: _notify(v, file),
            "remotes": lambda v: _remotes(v, file), "docker": lambda v: _docker(v, file)}) from None


def _load_config(path: Path | None, overrides: dict[str, Any],
                 node_of: Callable[[Path], str | None] | None) -> AgentConfig:
    values: dict[str, Any] = {}
    lines: dict[str, int | None] = {}  # the line each top-level setting is on in the file
    overrides = dict(overrides)
    file = str(path) if path else "command line"
    if path is not None:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read agent config: {exc.strerror}", file=str(path)) from exc
        doc = load_yaml(raw, str(path))
        if doc.data is not None and not isinstance(doc.data, dict):
            raise ConfigError("agent config must be a mapping", file=str(path), line=1)
        known = {f.name for f in fields(AgentConfig)}
        for written, value in (doc.data or {}).items():
            key = str(written).replace("-", "_")
            if key not in known:
                raise ConfigError(f"unknown setting {key!r} (known: {', '.join(sorted(known))})",
                                  file=str(path), line=doc.line((written,)))
            values[key] = value
            lines[key] = doc.line((written,))
    host_values = values.pop("host", None) or {}
    if isinstance(host_values, dict):
        host_values = {str(k).replace("-", "_"): v for k, v in host_values.items()}
    if not isinstance(host_values, dict) or set(host_values) - {f.name for f in fields(HostConfig)}:
        raise ConfigError(f"host: a mapping of {', '.join(f.name for f in fields(HostConfig))}", file=file)
    secrets_values = values.pop("secrets", None) or {}
    if not isinstance(secrets_values, dict) or set(secrets_values) - {"age_identity", "age-identity"}:
        raise ConfigError("secrets: a mapping with age_identity (the node's age key file)", file=file)
    flag = overrides.pop("secrets_age_identity", None)
    if flag is not None:
        secrets_values = {"age_identity": flag}
    trust_values = values.pop("trust", None) or {}
    if not isinstance(trust_values, dict):
        raise ConfigError("trust must be a mapping", file=file)
    trust_values = {str(k).replace("-", "_"): v for k, v in trust_values.items()}
    for key in ("allowed_signers", "gpg_home", "revoked", "policy", "sealers", "require_branch_binding"):
        flag = overrides.pop(f"trust_{key}", None)
        if flag is not None:
            trust_values[key] = flag
    unknown = set(trust_values) - {f.name for f in fields(TrustConfig)}
    if unknown:
        raise ConfigError(f"unknown trust setting {sorted(unknown)[0]!r}", file=file)
    if not isinstance(trust_values.get("require_branch_binding", False), bool):
        raise ConfigError("trust.require_branch_binding must be true or false", file=file)
    metrics = _metrics(values.pop("metrics", None), overrides.pop("metrics_textfile", None), file)
    notify = _notify(values.pop("notify", None), file)
    remotes = _remotes(values.pop("remotes", None), file)
    docker = _docker(values.pop("docker", None), file)
    given = {k: v for k, v in overrides.items() if v is not None}
    values.update(given)

    def number(key: str, default: float, *, zero: bool = False, most: float = WEEK) -> float:
        at = ("command line", None) if key in given else (file, lines.get(key))
        return _number(values.get(key, default), key, *at, zero=zero, most=most)
    if remotes and not values.get("remote"):
        values["remote"] = next((r.url for r in remotes if r.writes), remotes[0].url)
    if not values.get("node") and node_of is not None and isinstance(values.get("state_dir", ""), str | Path):
        values["node"] = node_of(Path(str(values.get("state_dir", "/var/lib/reconciler"))).expanduser())
    for required in ("node", "remote"):
        if not values.get(required):
            flag = "--" + required.replace("_", "-")
            raise ConfigError(f"missing setting {required!r} (give {flag} or set it in --config)", file=file)
    for key in ("branch", "state_dir", "ssh_command"):
        if key in values and values[key] is not None and not isinstance(values[key], str | Path):
            raise ConfigError(f"{key} must be a string", file=file)
        if key in values and values[key] is None and key != "ssh_command":
            raise ConfigError(f"{key} must not be empty", file=file)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", str(values["node"])):
        raise ConfigError(f"node name {values['node']!r} must be letters, digits, '.', '_' or '-'", file=file)
    try:
        cfg = AgentConfig(
            node=str(values["node"]),
            remote=_remote(str(values["remote"]), *(("command line", "--remote", None) if "remote" in given
                                                      else (file, "remote", lines.get("remote")))),
            branch=str(values.get("branch", "main")),
            state_dir=Path(str(values.get("state_dir", "/var/lib/reconciler"))).expanduser(),
            interval=number("interval", 60.0),
            jitter=number("jitter", 10.0, zero=True),
            supervise_interval=number("supervise_interval", 2.0),
            min_free_mb=number("min_free_mb", 16.0, zero=True, most=float(1 << 40)),
            ssh_command=values.get("ssh_command"),
            note_key=_path(values.get("note_key")),
            trust=TrustConfig(
                allowed_signers=_path(trust_values.get("allowed_signers")),
                gpg_home=_path(trust_values.get("gpg_home")),
                revoked=_path(trust_values.get("revoked")),
                policy=str(trust_values.get("policy", "every-commit")),
                sealers=_path(trust_values.get("sealers")),
                require_branch_binding=trust_values.get("require_branch_binding", False),
            ),
            host=HostConfig(
                root=Path(str(host_values.get("root", "/"))),
                systemctl=_argv(host_values.get("systemctl", ["systemctl"])),
                exec=_argv(host_values.get("exec", [])),
                reboot_command=str(host_values.get("reboot_command", "systemctl reboot")),
                boot_id_file=Path(str(host_values.get("boot_id_file", "/proc/sys/kernel/random/boot_id"))),
            ),
            metrics=metrics,
            notify=notify,
            secrets=SecretsConfig(_path(secrets_values.get("age_identity", secrets_values.get("age-identity")))),
            remotes=remotes,
            docker=docker,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"bad setting: {exc}", file=file) from exc
    if cfg.trust.policy not in POLICIES:
        raise ConfigError(f"trust policy {cfg.trust.policy!r} is not one of {', '.join(POLICIES)}", file=file)
    return cfg


# The longest wait a setting in seconds may ask for: a scheduler handed a time past the end of
# its clock (1e29 s) dies in its thread, and the node stops polling without a word.
WEEK = 7 * 24 * 3600.0


def _number(value: Any, key: str, file: str, line: int | None, *, zero: bool, most: float) -> float:
    """A setting in seconds (or MB): a number (a string of one, as a flag gives it), not a
    boolean, > 0 (>= 0 with ``zero``) and at most ``most``."""
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: {value!r} is not a number", file=file, line=line) from None
    if not (number >= 0 if zero else number > 0) or not number <= most:
        raise ConfigError(f"{key}: {value!r} must be {'>= 0' if zero else '> 0'} and at most {most:g}",
                          file=file, line=line)
    return number


def _mapping(value: Any, what: str, keys: tuple[str, ...], file: str) -> dict[str, Any]:
    """A nested settings mapping, its keys with '-' read as '_'; unknown keys are an error."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a mapping of {', '.join(keys)}", file=file)
    out = {str(k).replace("-", "_"): v for k, v in value.items()}
    unknown = sorted(set(out) - set(keys))
    if unknown:
        raise ConfigError(f"unknown setting {what}.{unknown[0]} (known: {', '.join(keys)})", file=file)
    return out


def _metrics(value: Any, textfile_flag: Any, file: str) -> MetricsConfig:
    m = _mapping(value, "metrics", ("listen", "textfile", "allow_non_loopback"), file)
    allow = m.get("allow_non_loopback", False)
    if not isinstance(allow, bool):
        raise ConfigError("metrics.allow_non_loopback must be true or false", file=file)
    listen = m.get("listen")
    if listen is not None:
        host, port = split_listen(listen, file)
        if not allow and not is_loopback(host):
            raise ConfigError(f"metrics.listen {listen!r} is not a loopback address (the exporter has no "
                              "authentication): use 127.0.0.1 or ::1, or set metrics.allow_non_loopback: true",
                              file=file)
        listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    textfile = textfile_flag if textfile_flag is not None else m.get("textfile")
    if textfile is not None and (not isinstance(textfile, str | Path) or not str(textfile)):
        raise ConfigError("metrics.textfile must be a file path", file=file)
    return MetricsConfig(listen, _path(textfile), allow)


def split_listen(listen: Any, file: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:9469`` for IPv6) -> (host, port); a clear error otherwise."""
    text = str(listen)
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not isinstance(listen, str) or not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"metrics.listen {text!r} must be host:port (127.0.0.1:9469)", file=file)
    return host, int(port)


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def _notify(value: Any, file: str) -> NotifyConfig:
    n = _mapping(value, "notify", ("webhook", "apprise"), file)
    webhook = None
    if n.get("webhook") is not None:
        w = _mapping(n["webhook"], "notify.webhook", ("url", "secret_env", "tries", "retry_delay", "timeout"), file)
        url = w.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError("notify.webhook.url must be an http:// or https:// URL", file=file)
        env = w.get("secret_env")
        if env is not None and (not isinstance(env, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env)):
            raise ConfigError("notify.webhook.secret_env must be the name of an environment variable "
                              "(the secret itself never goes in a config file)", file=file)
        try:
            tries, delay, timeout = int(w.get("tries", 3)), float(w.get("retry_delay", 1.0)), \
                float(w.get("timeout", 5.0))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"notify.webhook: tries, retry_delay and timeout must be numbers ({exc})",
                              file=file) from exc
        if not 1 <= tries <= 10 or not 0 <= delay <= 60 or not 0 < timeout <= 60:
            raise ConfigError("notify.webhook: tries must be 1..10, retry_delay 0..60s, timeout above 0 up to "
                              "60s (a delivery must not hold a pass up for long)", file=file)
        webhook = WebhookConfig(url, env, tries, delay, timeout)
    targets = n.get("apprise", [])
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not all(isinstance(t, str) and "://" in t for t in targets):
        raise ConfigError("notify.apprise must be a list of apprise URLs (mailto://..., slack://...)", file=file)
    return NotifyConfig(webhook, tuple(targets))


def _docker(value: Any, file: str) -> DockerConfig:
    d = _mapping(value, "docker", ("registries",), file)
    registries = d.get("registries") or {}
    if not isinstance(registries, dict):
        raise ConfigError("docker.registries must map a registry host to {username, password_file or "
                          "password_env}", file=file)
    logins = []
    for host, login in sorted(registries.items(), key=lambda kv: str(kv[0])):
        what = f"docker.registries.{host}"
        if not isinstance(host, str) or not host or "/" in host or "://" in host:
            raise ConfigError(f"{what}: the key is a registry host as image names spell it "
                              "(registry.example.org, 127.0.0.1:5000, docker.io)", file=file)
        if isinstance(login, dict) and "password" in login:
            # The message never repeats the value: it is the secret that must not be here.
            raise ConfigError(f"{what}: the password itself never goes in the config: name a file that "
                              "holds it (password_file) or an environment variable (password_env)", file=file)
        m = _mapping(login, what, ("username", "password_file", "password_env"), file)
        user, pw_file, pw_env = m.get("username"), m.get("password_file"), m.get("password_env")
        if not isinstance(user, str) or not user:
            raise ConfigError(f"{what}.username must be a user name", file=file)
        if (pw_file is None) == (pw_env is None):
            raise ConfigError(f"{what}: give one of password_file (a file holding the password) or "
                              "password_env (the name of a variable holding it)", file=file)
        if pw_file is not None and (not isinstance(pw_file, str) or not pw_file):
            raise ConfigError(f"{what}.password_file must be a file path", file=file)
        if pw_env is not None and (not isinstance(pw_env, str) or not ENV_NAME.fullmatch(pw_env)):
            raise ConfigError(f"{what}.password_env must be the name of an environment variable", file=file)
        logins.append(RegistryLogin(host, user, _path(pw_file), pw_env))
    return DockerConfig(tuple(logins))


def _argv(value: Any) -> tuple[str, ...]:
    import shlex

    return tuple(shlex.split(value)) if isinstance(value, str) else tuple(str(v) for v in value)


def _path(value: Any) -> Path | None:
    return None if value in (None, "") else Path(str(value)).expanduser()


# The URL schemes git fetches from (git-fetch(1) "GIT URLS"). Any other ``x://`` would have git
# look for a helper ``git-remote-x``: a typo (``htps://``) failing at every poll as a network fault.
SCHEMES = ("file", "ssh", "git", "http", "https", "git+ssh", "ssh+git")


def _remote(url: str, file: str = "command line", what: str = "remote", line: int | None = None) -> str:
    """A plain local path is taken as a file:// URL (absolute), like git does; a git bundle
    (``bundle:///media/usb/cloud.bundle`` or a path ending in ``.bundle``) stays a path, the only
    way git reads one. A URL git cannot fetch from is refused here, as a setting: it is no fault
    of the network, and no retry mends it."""
    if url.startswith("bundle://"):
        return os.path.abspath(url.removeprefix("bundle://"))
    if "://" in url:
        _check_url(url, file, what, line)
        return url
    if url.startswith("git@") or ":" in url.split("/")[0]:
        return url
    if url.endswith(".bundle"):
        return os.path.abspath(url)
    return "file://" + os.path.abspath(url)


def _check_url(url: str, file: str, what: str, line: int | None) -> None:
    """A URL of a scheme git fetches from, with a host (file://: none, an absolute path)."""
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    forms = "file:///path, ssh://host/path, git://host/path, https://host/path, user@host:path or a local path"
    if scheme not in SCHEMES:  # named by its scheme only: the rest may hold a password
        raise ConfigError(f"{what}: git cannot fetch from {scheme + '://'!r} URLs (give {forms})",
                          file=file, line=line)
    host = rest.split("/", 1)[0].rpartition("@")[2]
    name = host[1:host.find("]")] if host.startswith("[") else host.partition(":")[0]
    if scheme == "file" and host not in ("", "localhost"):
        raise ConfigError(f"{what}: a file:// URL takes an absolute path, three slashes: file:///{rest}",
                          file=file, line=line)
    if scheme != "file" and not name:
        raise ConfigError(f"{what}: a {scheme}:// URL names no host (give {forms})", file=file, line=line)


def _probe(item: dict[str, Any], i: int, role: str, file: str) -> tuple[str | None, float]:
    probe = item.get("probe")
    if probe is None:
        if "check_every" in item:
            raise ConfigError(f"remotes[{i}]: check_every without a probe", file=file)
        return None, RemoteConfig.check_every
    parts = urlsplit(str(probe))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"remotes[{i}]: probe is not an http:// or https:// URL", file=file)
    if role == "write":
        raise ConfigError(f"remotes[{i}]: a probe is for a remote that is read (role: read or both)", file=file)
    every = _number(item.get("check_every", RemoteConfig.check_every), f"remotes[{i}].check_every", file, None,
                    zero=False, most=WEEK)
    return str(probe), every


def _remotes(value: Any, file: str) -> tuple[RemoteConfig, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise ConfigError("remotes: a list of {url, role} (role: read, write or both)", file=file)
    out = []
    for i, item in enumerate(value):
        item = {"url": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or not item.get("url") or set(item) - {"url", "role", "probe", "check_every"}:
            raise ConfigError(f"remotes[{i}]: a URL, or a mapping of url, role, probe and check_every", file=file)
        role = str(item.get("role", "both"))
        if role not in ROLES:
            raise ConfigError(f"remotes[{i}]: role {role!r} is not one of {', '.join(ROLES)}", file=file)
        url = _remote(str(item["url"]), file, f"remotes[{i}].url")
        if role != "read" and not ("://" in url or ":" in url.split("/")[0]):
            raise ConfigError(f"remotes[{i}]: a git bundle can only be read (role: read)", file=file)
        probe, check_every = _probe(item, i, role, file)
        out.append(RemoteConfig(url, role, probe, check_every))
    if not any(r.reads for r in out):
        raise ConfigError("remotes: none can be read (give one a role of read or both)", file=file)
    return tuple(out)
