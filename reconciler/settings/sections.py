"""The agent settings' nested sections (metrics, notify, docker) and the values every section
reads (seconds, paths, commands): each check says what it finds to a ``Problems`` and goes on
with a stand-in value, so a file with several mistakes has them all said at once.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from reconciler.core.errors import ConfigError
from reconciler.drivers.registry import ENV_NAME, RegistryLogin
from reconciler.settings.agent import DockerConfig, MetricsConfig, NotifyConfig, ReceiverConfig, WebhookConfig
from reconciler.settings.problems import At, Problems, name_of

# The longest wait a setting in seconds may ask for: a scheduler handed a time past the end of
# its clock (1e29 s) dies in its thread, and the node stops polling without a word.
WEEK = 7 * 24 * 3600.0


def number(value: Any, at: At, p: Problems, *, zero: bool = False, most: float = WEEK,
           flag: bool = False) -> float:
    """A setting in seconds (or MB): a number (a string of one, as a flag gives it), not a
    boolean, > 0 (>= 0 with ``zero``) and at most ``most``."""
    key = name_of(at)
    try:
        if isinstance(value, bool):
            raise ValueError
        found = float(value)
    except (TypeError, ValueError):
        p.add(at, f"{key}: {value!r} is not a number", flag=flag)
        return most
    if not (found >= 0 if zero else found > 0) or not found <= most:
        p.add(at, f"{key}: {value!r} must be {'>= 0' if zero else '> 0'} and at most {most:g}", flag=flag)
    return found


def path(value: Any, at: At, p: Problems, *, flag: bool = False) -> Path | None:
    """A file's path; none given: None."""
    if value in (None, ""):
        return None
    if not isinstance(value, str | Path):
        p.add(at, f"{name_of(at)} must be a file path", flag=flag)
        return None
    return Path(value).expanduser()


def argv(value: Any, at: At, p: Problems) -> tuple[str, ...]:
    """A command: a string split as a shell would, or a list of its words."""
    import shlex

    if isinstance(value, str):
        return tuple(shlex.split(value))
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return tuple(str(v) for v in value)
    p.add(at, f"{name_of(at)}: {value!r} must be a command (a string, or a list of strings)")
    return ()


def mapping(value: Any, at: At, p: Problems, keys: tuple[str, ...]) -> dict[str, Any]:
    """A nested settings mapping, its keys with '-' read as '_'. An unknown key is said by the
    walk of the whole file (``problems.unknown_settings``), with the name nearest to it."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        p.add(at, f"{name_of(at)} must be a mapping of {', '.join(keys)}")
        return {}
    return {str(k).replace("-", "_"): v for k, v in value.items()}


def metrics(value: Any, textfile_flag: Any, p: Problems) -> MetricsConfig:
    m = mapping(value, ("metrics",), p, ("listen", "textfile", "allow_non_loopback"))
    allow = m.get("allow_non_loopback", False)
    if not isinstance(allow, bool):
        p.add(("metrics", "allow_non_loopback"), "metrics.allow_non_loopback must be true or false")
    listen = m.get("listen")
    if listen is not None:
        try:
            host, port = split_listen(listen, p.file)
        except ConfigError as exc:
            p.add(("metrics", "listen"), exc.message.removeprefix(f"{p.file}: "))
            listen = None
        else:
            if allow is not True and not is_loopback(host):
                p.add(("metrics", "listen"), f"metrics.listen {listen!r} is not a loopback address (the exporter "
                      "has no authentication): use 127.0.0.1 or ::1, or set metrics.allow_non_loopback: true")
            listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    textfile = textfile_flag if textfile_flag is not None else m.get("textfile")
    if textfile is not None and (not isinstance(textfile, str | Path) or not str(textfile)):
        p.add(("metrics", "textfile"), "metrics.textfile must be a file path", flag=textfile_flag is not None)
        textfile = None
    return MetricsConfig(listen, path(textfile, ("metrics", "textfile"), p), allow is True)


def receiver(value: Any, p: Problems) -> ReceiverConfig:
    """``receiver: {listen, secret_file}``: both or neither (a receiver without a secret would
    let anyone make the node poll)."""
    r = mapping(value, ("receiver",), p, ("listen", "secret_file"))
    listen, secret = r.get("listen"), r.get("secret_file")
    if listen is None and secret is None:
        return ReceiverConfig()
    if listen is None or secret is None:
        p.add(("receiver",), "receiver needs both listen (host:port) and secret_file")
        return ReceiverConfig()
    try:
        host, port = split_listen(listen, p.file)
    except ConfigError as exc:
        p.add(("receiver", "listen"), exc.message.removeprefix(f"{p.file}: ").replace("metrics.listen",
                                                                                        "receiver.listen"))
        return ReceiverConfig()
    return ReceiverConfig(f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                          path(secret, ("receiver", "secret_file"), p))


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


def notify(value: Any, p: Problems) -> NotifyConfig:
    n = mapping(value, ("notify",), p, ("webhook", "apprise"))
    webhook = _webhook(n["webhook"], p) if n.get("webhook") is not None else None
    targets = n.get("apprise", [])
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not all(isinstance(t, str) and "://" in t for t in targets):
        p.add(("notify", "apprise"), "notify.apprise must be a list of apprise URLs (mailto://..., slack://...)")
        targets = []
    return NotifyConfig(webhook, tuple(targets))


def _webhook(value: Any, p: Problems) -> WebhookConfig | None:
    at: At = ("notify", "webhook")
    w = mapping(value, at, p, ("url", "secret_env", "tries", "retry_delay", "timeout"))
    url = w.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        p.add((*at, "url"), "notify.webhook.url must be an http:// or https:// URL")
    env = w.get("secret_env")
    if env is not None and (not isinstance(env, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env)):
        p.add((*at, "secret_env"), "notify.webhook.secret_env must be the name of an environment variable "
              "(the secret itself never goes in a config file)")
    try:
        tries, delay, timeout = int(w.get("tries", 3)), float(w.get("retry_delay", 1.0)), \
            float(w.get("timeout", 5.0))
    except (TypeError, ValueError) as exc:
        p.add(at, f"notify.webhook: tries, retry_delay and timeout must be numbers ({exc})")
        return None
    if not 1 <= tries <= 10 or not 0 <= delay <= 60 or not 0 < timeout <= 60:
        p.add(at, "notify.webhook: tries must be 1..10, retry_delay 0..60s, timeout above 0 up to "
              "60s (a delivery must not hold a pass up for long)")
    return WebhookConfig(str(url), env, tries, delay, timeout)


def docker(value: Any, p: Problems) -> DockerConfig:
    d = mapping(value, ("docker",), p, ("registries",))
    registries = d.get("registries") or {}
    if not isinstance(registries, dict):
        p.add(("docker", "registries"), "docker.registries must map a registry host to {username, "
              "password_file or password_env}")
        registries = {}
    logins = []
    for host, login in sorted(registries.items(), key=lambda kv: str(kv[0])):
        at: At = ("docker", "registries", str(host))
        what = name_of(at)
        if not isinstance(host, str) or not host or "/" in host or "://" in host:
            p.add(at, f"{what}: the key is a registry host as image names spell it "
                  "(registry.example.org, 127.0.0.1:5000, docker.io)")
        password = isinstance(login, dict) and "password" in login
        if password:
            # The message never repeats the value: it is the secret that must not be here.
            p.add((*at, "password"), f"{what}: the password itself never goes in the config: name a file "
                  "that holds it (password_file) or an environment variable (password_env)")
        m = mapping(login, at, p, ("username", "password_file", "password_env"))
        user, pw_file, pw_env = m.get("username"), m.get("password_file"), m.get("password_env")
        if not isinstance(user, str) or not user:
            p.add((*at, "username"), f"{what}.username must be a user name")
        if (pw_file is None) == (pw_env is None) and not password:
            p.add(at, f"{what}: give one of password_file (a file holding the password) or "
                  "password_env (the name of a variable holding it)")
        if pw_file is not None and (not isinstance(pw_file, str) or not pw_file):
            p.add((*at, "password_file"), f"{what}.password_file must be a file path")
        if pw_env is not None and (not isinstance(pw_env, str) or not ENV_NAME.fullmatch(pw_env)):
            p.add((*at, "password_env"), f"{what}.password_env must be the name of an environment variable")
        logins.append(RegistryLogin(str(host), str(user), path(pw_file, (*at, "password_file"), p), pw_env))
    return DockerConfig(tuple(logins))
