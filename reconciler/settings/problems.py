"""Every mistake of an agent settings file at once, each at its line: a node's operator fixing a
config by hand should not find the second typo only after restarting for the first.

``load`` stops at the first problem it meets; when it does, the file is read again here and
looked over whole: every key the settings do not have (at any depth, with the name nearest to
it), and the problem ``load`` met, placed on the line of the setting it names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from reconciler.core.errors import BadInput, ConfigError
from reconciler.core.yamlfile import YamlDoc, load_yaml, near
from reconciler.drivers.registry import RegistryLogin
from reconciler.settings.agent import (
    AgentConfig,
    HostConfig,
    MetricsConfig,
    RemoteConfig,
    SecretsConfig,
    TrustConfig,
    WebhookConfig,
)

Shape = dict[str, Any]  # a setting's name -> the shape of its value: None (a value), a Shape, [Shape], {"*": Shape}


def _names(cls: Any, *leave_out: str) -> Shape:
    return {f.name: None for f in fields(cls) if f.name not in leave_out}


def shape() -> Shape:
    """The settings file's keys, read off the settings' own dataclasses."""
    top = _names(AgentConfig)
    top.update(trust=_names(TrustConfig), host=_names(HostConfig), metrics=_names(MetricsConfig),
               secrets=_names(SecretsConfig), remotes=[_names(RemoteConfig)],
               notify={"webhook": _names(WebhookConfig), "apprise": None},
               docker={"registries": {"*": _names(RegistryLogin, "registry")}})  # the host is the key
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
                hint = near(key, want) or f" (known: {', '.join(sorted(want))})"
                found.append((doc.line((*at, str(written))), f"unknown setting {name if dotted else repr(key)}{hint}"))

    walk(doc.data, shape(), (), "")
    return found


_NAMED = re.compile(r"(?:unknown setting )?'?([A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*|\[\d+\])*)")


def placed(doc: YamlDoc, message: str) -> int | None:
    """The line of the setting a message starts by naming (``metrics.listen '9469' must...``,
    ``remotes[1]: ...``), or of the nearest part of it that the file has."""
    named = _NAMED.match(message)
    if named is None:
        return None
    at: list[str | int] = []
    for part in re.findall(r"[A-Za-z_][\w-]*|\[\d+\]", named.group(1)):
        at.append(int(part[1:-1]) if part.startswith("[") else part)
    return doc.line(tuple(at)) if at and at[0] in (doc.data or {}) else None


class SettingsProblems(ConfigError):
    """Several mistakes of one settings file: the message is one line for each."""

    def __init__(self, file: str, problems: list[Located]) -> None:
        line, message = problems[0]
        super().__init__(message, file=file, line=line)
        self.problems = problems
        self.args = ("\n".join(str(ConfigError(m, file=file, line=n)) for n, m in problems),)


def every_problem(first: ConfigError, path: Path, sections: Mapping[str, Callable[[Any], object]]) -> ConfigError:
    """``first`` (what ``load`` stopped at) with every other mistake of the file ``path``: its
    unknown keys, and what each of ``sections`` (a setting's own check, given the value the file
    has for it) finds."""
    file = str(path)
    if first.file != file:
        return first  # a flag's mistake: said as it is
    try:
        doc = load_yaml(path.read_bytes(), file)
    except (OSError, BadInput):
        return first
    if not isinstance(doc.data, dict):
        return first
    found = unknown_settings(doc)
    others: list[ConfigError] = [first]
    for key, check in sections.items():
        try:
            check(doc.data.get(key))
        except ConfigError as found_there:
            others.append(found_there)
    mistyped = {m.removeprefix("unknown setting ").split(".")[0].split("[")[0] for _, m in found}
    for error in others:
        message = str(error).removeprefix(f"{file}:{error.line}: " if error.line else f"{file}: ")
        # An unknown key is found above, each at its line, named: not again as its mapping's fault.
        section = message.split(":")[0].split(".")[0].split("[")[0].split(" ")[0]
        if message.startswith(("unknown setting", "unknown trust setting")) or (
                section in mistyped and "mapping" in message):
            continue
        found.append((error.line or placed(doc, message), message))
    unique = sorted(dict.fromkeys(found), key=lambda p: p[0] or 0)
    if len(unique) == 1 and unique[0][0] == first.line or not unique:
        return first  # the one mistake, already said where it is
    problems = SettingsProblems(file, unique)
    problems.reason = first.reason
    return problems
