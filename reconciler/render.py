"""Templates + inventory -> ``Desired`` for one node. Pure: no I/O, no clock, no driver.

Templates run in Jinja2's immutable sandbox with ``StrictUndefined``: a template cannot call
unsafe attributes or mutate its inputs, and a missing variable is an error naming the file and
line, never an empty string on a production node.

Context of every template, runtime string and health target:

- every variable, precedence low to high: the service's ``defaults``, the repo's ``vars``, the
  node's groups' ``vars`` (in the order the node lists its groups), the node's own ``vars``;
- ``node`` (this node's name), ``service`` (this service's name), ``release``;
- ``groups``: group name -> sorted member node names;
- ``hostvars``: node name -> that node's variables (without service defaults).

The commit id is deliberately not in the context: a slice must change only when its inputs do.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import jinja2
import jinja2.sandbox

from .errors import RenderError
from .model import MIN_HEALTHY, ActionKind, Desired, DesiredService, FileSpec, Health, Reload, Rule, Runtime
from .repo import DeploymentRepo, ServiceDef

PORT = re.compile(r"((\d{1,3}\.){3}\d{1,3}:)?\d{1,5}:\d{1,5}(/(tcp|udp))?")
HOSTPORT = re.compile(r"[^:\s]+:\d{1,5}")
VOLUME = re.compile(r"[^:]+:/[^:]*(:(ro|rw))?")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class _RepoLoader(jinja2.BaseLoader):
    """Templates by their repo path, so errors name ``services/x/templates/y.j2``."""

    def __init__(self, sources: Mapping[str, str]) -> None:
        self.sources = sources

    def get_source(
        self, environment: jinja2.Environment, template: str
    ) -> tuple[str, str | None, Callable[[], bool] | None]:
        if template not in self.sources:
            raise jinja2.TemplateNotFound(template)
        return self.sources[template], template, lambda: True


def _environment(templates: Mapping[str, str]) -> jinja2.Environment:
    return jinja2.sandbox.ImmutableSandboxedEnvironment(
        loader=_RepoLoader(templates),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


_INLINE: dict[tuple[int, str], tuple[jinja2.Environment, jinja2.Template]] = {}


def _inline_template(env: jinja2.Environment, text: str) -> jinja2.Template:
    """Inline strings (commands, ports, health targets) compiled once per environment."""
    hit = _INLINE.get((id(env), text))
    if hit is not None and hit[0] is env:
        return hit[1]
    if len(_INLINE) > 65536:
        _INLINE.clear()
    tpl = env.from_string(text)
    _INLINE[(id(env), text)] = (env, tpl)
    return tpl


def _template_line(tb: TracebackType | None, filename: str) -> int | None:
    """Jinja rewrites tracebacks so template frames carry the template's file and line."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _render(
    env: jinja2.Environment,
    ctx: Mapping[str, Any],
    *,
    name: str | None,
    text: str | None,
    file: str,
    line: int | None,
    node: str,
) -> str:
    """Render a template by ``name``, or an inline ``text`` from ``file`` at ``line``."""
    if name is None and text is not None and "{" not in text:
        return text  # most runtime strings are plain: no need to compile them
    try:
        tpl = env.get_template(name) if name else _inline_template(env, text or "")
        return tpl.render(ctx)
    except jinja2.TemplateSyntaxError as exc:
        where, at = (exc.filename or file, exc.lineno) if name else (file, line)
        raise RenderError(f"node {node}: template syntax error: {exc.message}", file=where, line=at) from exc
    except jinja2.TemplateNotFound as exc:
        raise RenderError(f"node {node}: template not found: {exc.name}", file=file, line=line) from exc
    except jinja2.UndefinedError as exc:
        at = _template_line(exc.__traceback__, name) if name else line
        raise RenderError(f"node {node}: {exc.message}", file=name or file, line=at) from exc
    except jinja2.exceptions.SecurityError as exc:
        at = _template_line(exc.__traceback__, name) if name else line
        raise RenderError(f"node {node}: unsafe template: {exc}", file=name or file, line=at) from exc
    except Exception as exc:  # any error a template's expression raises (1/0, bad filter arg)
        at = _template_line(exc.__traceback__, name) if name else line
        raise RenderError(f"node {node}: {type(exc).__name__}: {exc}", file=name or file, line=at) from exc


def context(repo: DeploymentRepo, node: str, svc: ServiceDef) -> dict[str, Any]:
    ctx: dict[str, Any] = dict(svc.defaults)
    ctx.update(repo.node_vars(node))
    ctx.update(
        node=node,
        service=svc.name,
        release=repo.release,
        groups=repo.group_members,
        hostvars=repo.hostvars,
    )
    return ctx


_ENVIRONMENTS: dict[int, tuple[ServiceDef, jinja2.Environment]] = {}


def _environment_for(svc: ServiceDef) -> jinja2.Environment:
    """One sandbox per service definition, so each template compiles once however many nodes
    render it (keyed by identity; the entry keeps the definition alive so ids are not reused)."""
    hit = _ENVIRONMENTS.get(id(svc))
    if hit is not None and hit[0] is svc:
        return hit[1]
    if len(_ENVIRONMENTS) > 4096:
        _ENVIRONMENTS.clear()
    env = _environment(svc.templates)
    _ENVIRONMENTS[id(svc)] = (svc, env)
    return env


# (kind, name) -> why this node cannot run a process as that "user" or "group", or None.
Accounts = Callable[[str, str], str | None]


def render_service(repo: DeploymentRepo, node: str, svc: ServiceDef,
                   accounts: Accounts | None = None) -> DesiredService:
    """``accounts``: given on the node itself (the agent), which checks the process driver's
    users and groups there; a reviewer's machine renders without it."""
    env = _environment_for(svc)
    ctx = context(repo, node, svc)

    def inline(text: str, key: str) -> str:
        return _render(env, ctx, name=None, text=text, file=svc.file, line=svc.lines.get(key), node=node)

    files = []
    for decl in sorted(svc.files, key=lambda d: d.path):
        if decl.template is not None:
            tpl = svc.template_path(decl.template)
            text = _render(env, ctx, name=tpl, text=None, file=svc.file, line=decl.line, node=node)
            try:
                content = text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RenderError(f"node {node}: rendered text is not valid UTF-8 ({exc.reason})", file=tpl) from exc
        else:
            assert decl.source is not None
            content = svc.sources[svc.source_path(decl.source)]
        files.append(FileSpec(decl.path, decl.mode, content))

    command = tuple(inline(arg, "command") for arg in svc.command)
    env_vars = tuple(sorted((k, inline(v, "env")) for k, v in svc.env.items()))
    health = Health()
    timeout = float(svc.health.get("timeout", repo.settings.get("defaults", {}).get("health_timeout", 10)))
    min_healthy = float(svc.health.get("min_healthy", MIN_HEALTHY))
    for kind in ("http", "tcp", "command"):
        if kind in svc.health:
            health = Health(kind, inline(str(svc.health[kind]), "health"), timeout, min_healthy)
    if health.kind == "tcp" and not HOSTPORT.fullmatch(health.target):
        raise RenderError(f"node {node}: health: tcp {health.target!r} is not host:port", file=svc.file,
                          line=svc.lines.get("health"))
    if health.kind == "running":
        health = Health("running", "", timeout, min_healthy)
    c = svc.container

    def strings(key: str, pattern: re.Pattern[str] | None = None, form: str = "") -> tuple[str, ...]:
        out = tuple(inline(str(v), "runtime") for v in c.get(key, ()))
        for value in out:
            if pattern is not None and not pattern.fullmatch(value):
                raise RenderError(f"node {node}: {key}: {value!r} is not {form}", file=svc.file,
                                  line=svc.lines.get("runtime"))
        return out

    signal_name = svc.reload.get("signal", "SIGHUP")
    if not hasattr(signal, signal_name if signal_name.startswith("SIG") else f"SIG{signal_name}"):
        raise RenderError(f"node {node}: reload: unknown signal {signal_name!r}", file=svc.file,
                          line=svc.lines.get("runtime"))
    driver = repo.driver_of(node, svc.name)
    runtime = Runtime(
        driver, command, env_vars,
        image=inline(str(c.get("image", "")), "runtime"),
        ports=strings("ports", PORT, "[host_ip:]host_port:container_port[/tcp|udp]"),
        volumes=strings("volumes", VOLUME, "source:/target[:ro|rw]"),
        networks=tuple(sorted(strings("networks", NAME, "a network name"))),
        network_mode=str(c.get("network_mode", "")),
        restart=str(c.get("restart", "")), user=inline(str(c.get("user", "")), "runtime"),
        group=inline(str(c.get("group", "")), "runtime"),
        healthcheck=tuple(sorted((k, inline(str(v), "runtime")) for k, v in c.get("healthcheck", {}).items())),
        config_dir=str(c.get("config_dir", f"/etc/{svc.name}" if driver == "docker" else "")),
    )
    for kind, name in (("user", runtime.user), ("group", runtime.group)):
        problem = accounts(kind, name) if accounts is not None and name and driver == "process" else None
        if problem:
            raise RenderError(f"node {node}: service {svc.name}: runtime.{kind}: {problem}", file=svc.file,
                              line=svc.lines.get("runtime"))
    node_services = set(repo.services_of(node))
    return DesiredService(
        name=svc.name,
        runtime=runtime,
        files=tuple(files),
        health=health,
        depends_on=tuple(sorted(d for d in svc.depends_on if d in node_services)),
        drift=svc.drift,
        rules=tuple(Rule(str(r["file"]), ActionKind(r["action"]), tuple(str(k) for k in r.get("keys", ())),
                         str(r.get("unit", "")), str(r.get("command", "")))
                    for r in svc.on_change),
        reload=Reload(signal=svc.reload.get("signal", "SIGHUP"), command=svc.reload.get("command", "")),
        ceiling=ActionKind(svc.escalate_to),
        manual=svc.manual or repo.node(node).manual,
        drain=inline(svc.drain, "runtime") if svc.drain else "",
        undrain=inline(svc.undrain, "runtime") if svc.undrain else "",
    )


def render_node(repo: DeploymentRepo, node: str, commit: str, accounts: Accounts | None = None) -> Desired:
    """The node's whole slice. Same repo and node, same bytes."""
    repo.node(node)  # UnknownNode before anything else
    services = tuple(render_service(repo, node, repo.services[s], accounts) for s in repo.services_of(node))
    return Desired(node=node, commit=commit, services=services)
