"""Every mistake of an agent settings file at once, each at its line: a node's operator fixing a
config by hand should not find the second typo only after restarting for the first.

Each check of ``load`` (and of ``sections`` and ``remoteurl``) says what it finds to a
``Problems`` and goes on with a stand-in value; ``Problems`` places each on the line of the
setting it names, adds every key the settings do not have (at any depth, with the name nearest
to it), and raises them together: one line for each, ``file:line: setting: message``.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from reconciler.core.errors import ConfigError
from reconciler.core.yamlfile import YamlDoc, near
from reconciler.drivers.registry import RegistryLogin
from reconciler.settings.agent import (
    AgentConfig,
    HostConfig,
    MetricsConfig,
    ReceiverConfig,
    RemoteConfig,
    SecretsConfig,
    TrustConfig,
    WebhookConfig,
)

Shape = dict[str, Any]  # a setting's name -> the shape of its value: None (a value), a Shape, [Shape], {"*": Shape}
REFUSED = "refused"  # a name refused by its section's own check, which says why: neither unknown nor known


def _names(cls: Any, *leave_out: str) -> Shape:
    return {f.name: None for f in fields(cls) if f.name not in leave_out}


def shape() -> Shape:
    """The settings file's keys, read off the settings' own dataclasses."""
    top = _names(AgentConfig)
    top.update(trust=_names(TrustConfig), host=_names(HostConfig), metrics=_names(MetricsConfig),
               secrets=_names(SecretsConfig), remotes=[_names(RemoteConfig)],
               notify={"webhook": _names(WebhookConfig), "apprise": None}, receiver=_names(ReceiverConfig),
               # the host is the key; a password is refused by the docker check (never repeated)
               docker={"registries": {"*": {**_names(RegistryLogin, "registry"), "password": REFUSED}}})
    return top


Located = tuple[int | None, str]


def unknown_settings(doc: YamlDoc) -> list[Located]:
    """Each key the settings do not have, at its line, with the known name nearest to it."""
    found: list[Located] = []

    def walk(value: Any, want: Any, at: tuple[str | int, ...], dotted: str) -> None:
        if isinstance(want, list) and isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, want[0], (*at, i), f"{dotted}[{i}]")
        if not isinstance(want, dict) or not isinstance(value, dict):
            return
        for written, inner in value.items():
            key = str(written).replace("-", "_")
            name = f"{dotted}.{key}" if dotted else key
            if "*" in want:
                walk(inner, want["*"], (*at, str(written)), name)
            elif key in want:
                walk(inner, want[key], (*at, str(written)), name)
            else:
                known = [k for k, v in want.items() if v != REFUSED]
                hint = near(key, known) or f" (known: {', '.join(sorted(known))})"
                found.append((doc.line((*at, str(written))), f"unknown setting {name if dotted else repr(key)}{hint}"))

    walk(doc.data, shape(), (), "")
    return found


At = tuple[str | int, ...]  # where a setting is in the file: ("remotes", 1, "url")
Said = tuple[str, int | None, str]  # a problem: the file (or "command line"), its line, the message
FLAGS = "command line"


def name_of(at: At) -> str:
    """A setting's name as messages write it: ``remotes[1].url``."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in at).lstrip(".")


class Problems:
    """The mistakes of one settings source found so far. A check ``add``s what it finds and goes
    on with a stand-in value; ``done`` raises them all at once, or nothing."""

    def __init__(self, file: str, doc: YamlDoc | None = None) -> None:
        self.file, self.doc = file, doc
        self.found: list[Said] = [(file, line, m) for line, m in unknown_settings(doc)] if doc else []

    def add(self, at: At, message: str, *, flag: bool = False) -> None:
        """``message`` about the setting at ``at``; ``flag``: its value came from the command line."""
        self.found.append((FLAGS, None, message) if flag else (self.file, self.line(at), message))

    def line(self, at: At) -> int | None:
        """The line of the setting at ``at`` (its keys read with '-' as '_', as the settings are),
        or of the nearest part of it the file has; None for a setting the file does not name."""
        if self.doc is None:
            return None
        value, written = self.doc.data, []
        for part in at:
            if isinstance(value, dict):
                key = next((k for k in value if str(k).replace("-", "_") == part), None)
            else:
                key = part if isinstance(value, list) and isinstance(part, int) and part < len(value) else None
            if key is None:
                break
            written.append(key if isinstance(key, int) else str(key))
            value = value[key]
        return self.doc.line(tuple(written)) if written else None

    def done(self) -> None:
        """Raise every problem found (the command line's first, then the file's by line)."""
        said = sorted(dict.fromkeys(self.found), key=lambda s: (s[0] != FLAGS, s[1] or 0))
        if len(said) == 1:
            raise ConfigError(said[0][2], file=said[0][0], line=said[0][1])
        if said:
            raise SettingsProblems(said)


class SettingsProblems(ConfigError):
    """Several mistakes of one settings file: the message is one line for each."""

    def __init__(self, problems: list[Said]) -> None:
        file, line, message = problems[0]
        super().__init__(message, file=file, line=line)
        self.problems = problems
        self.args = ("\n".join(str(ConfigError(m, file=f, line=n)) for f, n, m in problems),)
