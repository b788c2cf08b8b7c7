"""Templates + inventory -> ``Desired`` for one node. Pure: no I/O, no driver; the one clock
read is the render deadline.

Templates run in Jinja2's immutable sandbox with ``StrictUndefined``: a template cannot call
unsafe attributes or mutate its inputs, and a missing variable is an error naming the file and
line, never an empty string on a production node. The sandbox also holds each node to
``Limits`` (time, output, value sizes, include depth; see ``sandbox``): past one, the node's
render is a ``RenderLimit`` naming template, line, node and service.

Context of every template, runtime string and health target:

- every variable, precedence low to high: the service's ``defaults``, the repo's ``vars``, the
  node's groups' ``vars`` (in the order the node lists its groups), the node's own ``vars``;
- ``node`` (this node's name), ``service`` (this service's name), ``release`` (the node's own,
  else the inventory's), ``pending_release`` (the release it is being deployed as, or "");
- ``groups``: group name -> sorted member node names;
- ``hostvars``: node name -> that node's variables (without service defaults);
  both only of the nodes of its own plane when it, or they, are split off (an isolated node, the
  old plane after a cutover: see ``controlplane``);
- ``secrets``: name -> value, from the ``secrets/*.yaml`` files this node can decrypt (the
  agent's identity; see ``secrets``). Without a key (review, validate) the values are markers
  ``<secret NAME HASH>``, for the files encrypted to the node's ``age_recipient`` variable.

A file whose template reads a secret, or whose content holds a secret's value, is a secret
file: mode 0600 (the owner's bits of its declared mode), and whoever prints it shows only that
it changed. On the node its hash is keyed (``FileSpec.key``, from the data keys of the SOPS
files whose values it holds), so no hash the node shows can confirm a guessed value. Runtime
strings (command, env, health, hooks) may not use secrets: they reach process tables, notes
and logs.

The commit id is deliberately not in the context: a slice must change only when its inputs do.
"""

from __future__ import annotations

import functools
import re
import signal
import sys
from collections.abc import Callable, Container, Generator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from types import TracebackType
from typing import Any, cast
from urllib.parse import urlsplit

import jinja2
import jinja2.bccache
import jinja2.sandbox

from reconciler.core.errors import RenderError, RenderLimit
from reconciler.core.limits import Limits
from reconciler.core.memo import ByIdentity
from reconciler.core.model import MIN_HEALTHY, ActionKind, Desired, DesiredService, FileSpec, Health, Reload, Runtime
from reconciler.render.sandbox import Budget, Sandbox, budget_in_use
from reconciler.render.secrets import SecretUnreadable, file_key, leaf_strings, placeholders
from reconciler.repo.load import DeploymentRepo, ServiceDef

PORT = re.compile(r"((\d{1,3}\.){3}\d{1,3}:)?\d{1,5}:\d{1,5}(/(tcp|udp))?")
HOSTPORT = re.compile(r"[^:\s]+:\d{1,5}")
VOLUME = re.compile(r"[^:]+:/[^:]*(:(ro|rw))?")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class _RepoLoader(jinja2.BaseLoader):
    """Templates by their repo path, so errors name ``services/x/templates/y.j2``. An include or
    import names a template relative to the service's templates/ (or by its repo path); a name
    with ``..`` or a leading ``/`` is not found: a template reads only its own service's
    templates, already loaded (no symlink among them, see ``tree``), never the disk."""

    def __init__(self, sources: Mapping[str, str], base: str) -> None:
        self.sources = sources
        self.base = base

    def get_source(
        self, environment: jinja2.Environment, template: str
    ) -> tuple[str, str | None, Callable[[], bool] | None]:
        path = template
        if template not in self.sources:
            rel = PurePosixPath(template)
            if rel.is_absolute() or ".." in rel.parts:
                raise jinja2.TemplateNotFound(template, f"{template} (outside {self.base}/)")
            path = f"{self.base}/{rel}"
        if path not in self.sources:
            if any(p.startswith(f"{path}/") for p in self.sources):
                raise _ADirectory(template, path)
            raise jinja2.TemplateNotFound(template)
        return self.sources[path], path, lambda: True


class _ADirectory(jinja2.TemplateNotFound):
    """Not "not found": the operator sees the path in the repo and would look for a typo."""

    def __init__(self, template: str, path: str) -> None:
        super().__init__(template, f"{path} is a directory, not a file")


class _CompiledOnce(jinja2.BytecodeCache):
    """Compiled templates kept in memory by name and source: the same template at both commits
    of a diff (two service definitions, two environments) is parsed and compiled once. Every
    environment here is a ``Sandbox`` with the same options, so the code is the same."""

    def __init__(self) -> None:
        self.code: dict[str, tuple[str, Any]] = {}

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        hit = self.code.get(bucket.key)
        if hit is not None and hit[0] == bucket.checksum:
            bucket.code = hit[1]

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        if len(self.code) > 4096:
            self.code.clear()
        self.code[bucket.key] = (bucket.checksum, bucket.code)


_COMPILED = _CompiledOnce()


def _environment(templates: Mapping[str, str], base: str) -> Sandbox:
    return Sandbox(
        loader=_RepoLoader(templates, base),
        bytecode_cache=_COMPILED,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        # The sources never change under an environment (one per service definition): no
        # up-to-date check on every get_template, a sixth of a diff's render time at scale.
        auto_reload=False,
    )


_INLINE: ByIdentity[jinja2.Template] = ByIdentity(65536)


def _inline_template(env: jinja2.Environment, text: str) -> jinja2.Template:
    """Inline strings (commands, ports, health targets) compiled once per environment."""
    key = (id(env), text)
    tpl = _INLINE.get(key)
    return tpl if tpl is not None else _INLINE.put(key, env.from_string(text), env)


def _template_where(tb: TracebackType | None, templates: Mapping[str, str]) -> tuple[str, int] | None:
    """The innermost template frame: Jinja rewrites tracebacks so template frames carry the
    template's file and line (an included template's own, not the include statement's)."""
    where = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in templates:
            where = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return where


def _stream(tpl: jinja2.Template, ctx: Mapping[str, Any], budget: Budget, what: str) -> str:
    """Render while counting: output past a limit stops the template where it is, so a loop
    that prints gigabytes fails after ``file_bytes``, not after allocating them. ``ctx`` already
    holds the environment's globals (``render_service`` merges them once per service): it is
    the template's context as it is, no copy of them and of every variable per file."""
    # Built directly, without the template's globals: Jinja only lists their names (a set built
    # from a ChainMap, a tenth of a fleet's render time) for a template imported as a module,
    # and an import builds a context of its own.
    context = jinja2.runtime.Context(tpl.environment, cast(dict[str, Any], ctx), tpl.name, tpl.blocks)
    chunks: list[str] = []
    size, counted = 0, 0
    # Output is often one character per chunk: count it here, and let the budget judge it only
    # every so many bytes or once this file passes its limit.
    batch = min(64 * 1024, budget.limits.file_bytes)
    gen = cast(Generator[str, None, None], tpl.root_render_func(context))  # a compiled template is a generator
    try:
        for chunk in gen:
            size += len(chunk)
            if size - counted >= batch or size > budget.limits.file_bytes:
                over = budget.output(size - counted, size, what)
                counted = size
                if over is not None:
                    # Thrown into the template, so the error carries the line that was printing.
                    gen.throw(RenderLimit(over))
            chunks.append(chunk)
    except Exception:
        # Rewrites the traceback so template frames carry the template's file and line.
        tpl.environment.handle_exception()
    over = budget.output(size - counted, size, what)
    if over is not None:
        raise RenderLimit(over)
    return "".join(chunks)


def _render(
    env: Sandbox,
    ctx: Mapping[str, Any],
    *,
    name: str | None,
    text: str | None,
    file: str,
    line: int | None,
    node: str,
    service: str,
    what: str,
    budget: Budget,
) -> str:
    """Render a template by ``name``, or an inline ``text`` from ``file`` at ``line``."""
    if name is None and text is not None and "{" not in text:
        return text  # most runtime strings are plain: no need to compile them
    if name is not None and name in env.over_limit:
        raise RenderLimit(f"node {node}, service {service}: not rendered: it passed a render limit for node "
                          f"{env.over_limit[name]}", file=name)
    sources = env.sources
    try:
        with budget_in_use(budget):
            tpl = env.file_template(name) if name else _inline_template(env, text or "")
            return _stream(tpl, ctx, budget, what)
    except RenderLimit as exc:
        # A loop that ran too long for one node runs as long for the next: the others of a
        # `validate` over the fleet are refused at once, naming the node it was measured on.
        if name is not None:
            env.over_limit.setdefault(name, node)
        where, at = _template_where(exc.__traceback__, sources) or ((name, None) if name else (file, line))
        raise RenderLimit(f"node {node}, service {service}: {exc}", file=where, line=at) from exc
    except jinja2.TemplateSyntaxError as exc:
        where, at = (exc.filename or file, exc.lineno) if name else (file, line)
        raise RenderError(f"node {node}: template syntax error: {exc.message}", file=where, line=at) from exc
    except jinja2.TemplateNotFound as exc:
        where, at = _template_where(exc.__traceback__, sources) or (file, line)
        what = str(exc.message) if isinstance(exc, _ADirectory) else f"template not found: {exc.message}"
        raise RenderError(f"node {node}, service {service}: {what}", file=where, line=at) from exc
    except jinja2.UndefinedError as exc:
        where, at = _template_where(exc.__traceback__, sources) or (name or file, None if name else line)
        raise RenderError(f"node {node}: {exc.message}", file=where, line=at) from exc
    except jinja2.exceptions.SecurityError as exc:
        where, at = _template_where(exc.__traceback__, sources) or (name or file, None if name else line)
        raise RenderError(f"node {node}: unsafe template: {exc}", file=where, line=at) from exc
    except (SecretUnreadable, RenderError) as exc:  # from ``secrets.<name>``: located, never a value
        where, at = _template_where(exc.__traceback__, sources) or (name or file, None if name else line)
        text = str(exc).split(": ", 1)[1] if exc.file else str(exc)
        raise type(exc)(f"node {node}, service {service}: {text}", file=where, line=at) from exc
    except Exception as exc:  # any error a template's expression raises (1/0, bad filter arg)
        where, at = _template_where(exc.__traceback__, sources) or (name or file, None if name else line)
        if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
            # Python's own bound on printing an int ({{ 10 ** 5000 }}); its advice, to raise it
            # with sys.set_int_max_str_digits, is not the operator's to follow.
            raise RenderLimit(f"node {node}, service {service}: a number of more than "
                              f"{sys.get_int_max_str_digits()} digits (render limit)", file=where, line=at) from exc
        raise RenderError(f"node {node}: {type(exc).__name__}: {exc}", file=where, line=at) from exc


class SecretView(Mapping[str, Any]):
    """``secrets`` in a template: the node's secrets by name. It notes that it was read (the
    file being rendered is then a secret file), and a name this node cannot read is an error
    naming the file that defines it, never an empty value."""

    def __init__(self, node: str, values: Mapping[str, Any], origin: Mapping[str, str], elsewhere: Mapping[str, str],
                 why: str, hash_keys: Mapping[str, bytes]) -> None:
        self._node = node
        self._values = dict(values)
        self._origin = dict(origin)  # name -> the file defining it
        self._elsewhere = dict(elsewhere)  # name -> the file defining it, which this node cannot read
        self._why = why
        self._hash_keys = dict(hash_keys)  # file -> its Opened.hash_key (on the node only)
        # Private (the sandbox refuses ``_`` names): a template cannot read the values as a set,
        # nor clear the mark of the file it is printing. ``_touched``: the files read since the mark.
        self._touched: set[str] = set()
        self._texts = {path: leaf_strings({n: v for n, v in self._values.items() if self._origin[n] == path})
                       for path in sorted(set(self._origin.values()))}

    def __getitem__(self, name: str) -> Any:
        if name in self._values:
            self._touched.add(self._origin[name])
            return self._values[name]
        if name in self._elsewhere:
            raise SecretUnreadable(f"secrets.{name} is in {self._elsewhere[name]}, which node {self._node} cannot "
                                   f"decrypt ({self._why})")
        raise RenderError(f"secrets.{name}: no such secret in secrets/*.yaml")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __iter__(self) -> Iterator[str]:
        self._touched.update(self._origin.values())
        return iter(sorted(self._values))

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"<secrets: {len(self._values)} names>"  # what {{ secrets }} prints: never the values



def _unmark(view: SecretView) -> None:
    view._touched = set()


def _holds_secret(view: SecretView, text: str | bytes) -> frozenset[str]:
    """The secret files whose values what was just rendered read, or holds as they are: none
    for a text with no secret in it."""
    if not view._texts:
        return frozenset(view._touched)
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return frozenset(view._touched | {path for path, texts in view._texts.items() if any(t in text for t in texts)})


def _file_key(view: SecretView, used: frozenset[str]) -> bytes:
    """The key a secret file's hash is keyed with: from the files it holds values of (b"" in a
    reviewer's render, where it holds markers)."""
    return file_key([view._hash_keys[p] for p in sorted(used) if p in view._hash_keys])


def secret_view(repo: DeploymentRepo, node: str) -> SecretView:
    """The secrets this node reads: the files it decrypted (on the node), or without a key the
    files encrypted to its ``age_recipient`` (a reviewer's render: markers, not values)."""
    hash_keys: dict[str, bytes] = {}
    if repo.unlocked is not None:
        readable: dict[str, Mapping[str, Any]] = {p: f.values for p, f in repo.unlocked.items()}
        hash_keys = {p: f.hash_key for p, f in repo.unlocked.items()}
        why = ("no age identity is configured on it: secrets.age_identity or --age-identity" if repo.no_identity
               else "its age key is not among the file's recipients")
    else:
        mine = repo.node_vars(node).get("age_recipient") or ()
        mine = {mine} if isinstance(mine, str) else set(mine)
        readable = {p: placeholders(f) for p, f in repo.secret_files.items() if mine & set(f.recipients)}
        why = ("the file is not encrypted to its age_recipient" if mine else
               "it has no age_recipient variable in the inventory")
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for path in sorted(readable):
        for name, value in readable[path].items():
            if name in origin:
                raise RenderError(f"node {node}: secrets.{name} is defined in {origin[name]} and {path}, "
                                  "both readable by this node", file=path)
            values[name], origin[name] = value, path
    elsewhere = {name: path for path, f in sorted(repo.secret_files.items()) if path not in readable
                 for name in f.names if name not in origin}
    return SecretView(node, values, origin, elsewhere, why, hash_keys)


@dataclass(frozen=True)
class NodeShare:
    """What every service of one node reads alike, computed once per node, not once per service
    (at 30 services a node, most of a render's own cost)."""

    vars: Mapping[str, Any]
    services: frozenset[str]
    secrets: SecretView
    release: str
    pending: str
    attached: bool
    groups: Mapping[str, list[str]]
    hostvars: Mapping[str, Mapping[str, Any]]
    node: str

    @functools.cached_property
    def own(self) -> Mapping[str, Any]:
        """What the render sets for the node itself, over every variable."""
        return {"node": self.node, "release": self.release, "pending_release": self.pending, "groups": self.groups,
                "hostvars": self.hostvars, "secrets": self.secrets}

    @functools.cached_property
    def view(self) -> Mapping[str, Any]:
        """The node's variables and ``own`` over them: a service's context is its defaults,
        this, and its own name and version."""
        return {**self.vars, **self.own}


def node_share(repo: DeploymentRepo, node: str) -> NodeShare:
    placement = repo.planes[node]
    groups, hostvars = repo.peers(node)
    return NodeShare(repo.node_vars(node), frozenset(repo.services_of(node)), secret_view(repo, node),
                     placement.release, placement.pending, placement.attached, groups, hostvars, node)


def context(repo: DeploymentRepo, node: str, svc: ServiceDef, pinned: Mapping[str, Any] | None = None,
            share: NodeShare | None = None, under: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``pinned``: variables an upgrade step holds at a value on this node (over everything but
    the render's own names). ``under``: names everything else is over (the sandbox's globals)."""
    share = share or node_share(repo, node)
    if pinned:
        return {**(under or {}), **svc.defaults, **share.vars, **pinned, **share.own, "service": svc.name,
                "service_version": svc.version}
    return {**(under or {}), **svc.defaults, **share.view, "service": svc.name, "service_version": svc.version}


@dataclass(frozen=True)
class _Compiled:
    """What a service definition's renders share on every node: its sandbox (each template
    compiles once however many nodes render it), and its runtime as built for each
    ``(driver, plane, default health timeout, VIP networks)`` when none of its runtime strings
    is a template (``_Run``; at 30 services a node, building the runtime per node was a third
    of a fleet diff's render time, for specs that mostly read no variable at all)."""

    env: Sandbox
    runs: dict[tuple[Any, ...], _Run]


_COMPILED_SERVICES: ByIdentity[_Compiled] = ByIdentity(4096)


def _compiled(svc: ServiceDef) -> _Compiled:
    """The service definition's entry, keyed by identity."""
    hit = _COMPILED_SERVICES.get(id(svc))
    if hit is None:
        hit = _COMPILED_SERVICES.put(id(svc), _Compiled(_environment(svc.templates, svc.template_path("").rstrip("/")),
                                                         {}), svc)
    return hit


# (kind, name) -> why this node cannot run a process as that "user" or "group", or None.
Accounts = Callable[[str, str], str | None]


def render_service(repo: DeploymentRepo, node: str, svc: ServiceDef, accounts: Accounts | None = None, *,
                   budget: Budget | None = None, pinned: Mapping[str, Any] | None = None,
                   share: NodeShare | None = None) -> DesiredService:
    """One service of a node. ``accounts``: given on the node itself (the agent), which checks
    the process driver's users and groups there; a reviewer's machine renders without it.
    ``budget``: what the node's render may still spend (a fresh one from the repo's limits when
    this service is rendered alone). ``share``: the node's (``render_node`` computes it once)."""
    compiled = _compiled(svc)
    env = compiled.env
    share = share or node_share(repo, node)
    ctx = context(repo, node, svc, pinned, share, env.globals)
    budget = budget or Budget(repo.limits)
    secrets: SecretView = ctx["secrets"]

    def inline(text: str, key: str) -> str:
        _unmark(secrets)
        out = _render(env, ctx, name=None, text=text, file=svc.file, line=svc.lines.get(key), node=node,
                      service=svc.name, what=key, budget=budget)
        if _holds_secret(secrets, out):
            # Never the value: a runtime string reaches ps, notes and logs; a file is private.
            raise RenderError(f"node {node}, service {svc.name}: {key} uses a secret: secrets belong in files "
                              "(written 0600)", file=svc.file, line=svc.lines.get(key))
        return out

    files = []
    for decl in svc.files_in_order:
        _unmark(secrets)
        if decl.template is not None:
            tpl = svc.template_path(decl.template)
            text = _render(env, ctx, name=tpl, text=None, file=svc.file, line=decl.line, node=node,
                           service=svc.name, what=decl.path, budget=budget)
            try:
                content = text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RenderError(f"node {node}: rendered text is not valid UTF-8 ({exc.reason})", file=tpl) from exc
            # Counted in characters while streaming; a file of wide characters may pass in bytes.
            over = budget.output(len(content) - len(text), len(content), decl.path)
        else:
            assert decl.source is not None
            tpl = svc.source_path(decl.source)
            content = svc.sources[tpl]
            over = budget.output(len(content), len(content), decl.path)
        if over is not None:
            raise RenderLimit(f"node {node}, service {svc.name}: {over}", file=tpl)
        used = _holds_secret(secrets, content)
        # Only the owner (the service's user, see the process driver) may read a secret file.
        files.append(FileSpec(decl.path, decl.mode & 0o700 if used else decl.mode, content, bool(used),
                              _file_key(secrets, used) if used else b""))

    driver = repo.driver_of(node, svc.name)
    timeout = repo.settings.get("defaults", {}).get("health_timeout", 10)
    # Everything the runtime reads besides its strings' variables.
    alike = (driver, share.attached, timeout, repo.vip_networks)
    run = compiled.runs.get(alike)
    _unmark(secrets)
    # A plain string that holds one of this node's secret values is refused all the same: the
    # node renders it anew, and the error names the string's key.
    if run is None or (secrets._texts and any(_holds_secret(secrets, said) for said in run.said)):
        run = _run(repo, node, svc, driver, share.attached, timeout, inline)
        if not run.templated:
            compiled.runs[alike] = run
    runtime = run.runtime
    for kind, name in (("user", runtime.user), ("group", runtime.group)):
        problem = accounts(kind, name) if accounts is not None and name and driver == "process" else None
        if problem:
            raise RenderError(f"node {node}: service {svc.name}: runtime.{kind}: {problem}", file=svc.file,
                              line=svc.lines.get("runtime"))
    node_services = share.services
    return DesiredService(
        name=svc.name,
        runtime=runtime,
        files=tuple(files),
        health=run.health,
        depends_on=tuple(sorted(d for d in svc.depends_on if d in node_services)) if svc.depends_on else (),
        drift=svc.drift,
        rules=svc.rules,
        reload=run.reload,
        ceiling=run.ceiling,
        manual=svc.manual or repo.node(node).manual,
        drain=run.drain,
        undrain=run.undrain,
    )


@dataclass(frozen=True)
class _Run:
    """How a service runs on a node: its runtime strings rendered and checked. ``said``: each
    string as rendered; ``templated``: whether any of them was a template (else the same for
    every node with the same driver and plane, see ``_Compiled``)."""

    runtime: Runtime
    health: Health
    reload: Reload
    ceiling: ActionKind
    drain: str
    undrain: str
    said: tuple[str, ...]
    templated: bool


def _http_url(text: str) -> bool:
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises for a port that is not a number or out of range)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not any(c.isspace() for c in text)


def _run(repo: DeploymentRepo, node: str, svc: ServiceDef, driver: str, attached: bool, timeout_default: Any,
         inline: Callable[[str, str], str]) -> _Run:
    said: list[str] = []
    templated = False

    def say(text: str, key: str) -> str:
        nonlocal templated
        templated = templated or "{" in text
        out = inline(text, key)
        said.append(out)
        return out

    command = tuple(say(arg, "command") for arg in svc.command)
    env_vars = tuple(sorted((k, say(v, "env")) for k, v in svc.env.items()))
    health = Health()
    timeout = float(svc.health.get("timeout", timeout_default))
    min_healthy = float(svc.health.get("min_healthy", MIN_HEALTHY))
    for kind in ("http", "tcp", "command"):
        if kind in svc.health:
            health = Health(kind, say(str(svc.health[kind]), "health"), timeout, min_healthy)
    if health.kind == "tcp" and not HOSTPORT.fullmatch(health.target):
        raise RenderError(f"node {node}: health: tcp {health.target!r} is not host:port", file=svc.file,
                          line=svc.lines.get("health"))
    if health.kind == "http" and not _http_url(health.target.strip()):  # urlopen strips it too
        # Else every check fails as "unhealthy" and each apply rolls back, never saying why.
        raise RenderError(f"node {node}: health: http {health.target!r} is not an http:// or https:// URL "
                          "with a host", file=svc.file, line=svc.lines.get("health"))
    if health.kind == "running":
        health = Health("running", "", timeout, min_healthy)
    c = svc.container

    def strings(key: str, pattern: re.Pattern[str] | None = None, form: str = "") -> tuple[str, ...]:
        out = tuple(say(str(v), "runtime") for v in c.get(key, ()))
        for value in out:
            if pattern is not None and not pattern.fullmatch(value):
                raise RenderError(f"node {node}: {key}: {value!r} is not {form}", file=svc.file,
                                  line=svc.lines.get("runtime"))
        return out

    signal_name = svc.reload.get("signal", "SIGHUP")
    if not hasattr(signal, signal_name if signal_name.startswith("SIG") else f"SIG{signal_name}"):
        raise RenderError(f"node {node}: reload: unknown signal {signal_name!r}", file=svc.file,
                          line=svc.lines.get("runtime"))
    networks, aliases = _networks(repo, node, svc, say, attached)
    runtime = Runtime(
        driver, command, env_vars,
        image=say(str(c.get("image", "")), "runtime"),
        ports=strings("ports", PORT, "[host_ip:]host_port:container_port[/tcp|udp]"),
        volumes=strings("volumes", VOLUME, "source:/target[:ro|rw]"),
        networks=networks, aliases=aliases,
        network_mode=str(c.get("network_mode", "")),
        restart=str(c.get("restart", "")), user=say(str(c.get("user", "")), "runtime"),
        group=say(str(c.get("group", "")), "runtime"),
        healthcheck=tuple(sorted((k, say(str(v), "runtime")) for k, v in c.get("healthcheck", {}).items())),
        config_dir=str(c.get("config_dir", f"/etc/{svc.name}" if driver == "docker" else "")),
    )
    return _Run(
        runtime, health,
        reload=Reload(signal=svc.reload.get("signal", "SIGHUP"), command=svc.reload.get("command", "")),
        ceiling=ActionKind(svc.escalate_to),
        drain=say(svc.drain, "runtime") if svc.drain else "",
        undrain=say(svc.undrain, "runtime") if svc.undrain else "",
        said=tuple(said), templated=templated,
    )


def _networks(repo: DeploymentRepo, node: str, svc: ServiceDef,
              inline: Callable[[str, str], str], attached: bool) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The networks (and the names it answers to on each) the service's container joins on this
    node: a VIP network only on a node of the live plane (see ``controlplane``)."""
    names: list[str] = []
    aliases: list[tuple[str, str]] = []
    for entry in svc.container.get("networks", ()):
        spec = entry if isinstance(entry, Mapping) else {"name": entry}
        name = inline(str(spec["name"]), "runtime")
        for value, form in ((name, "a network name"), *((inline(str(a), "runtime"), "an alias")
                                                          for a in spec.get("aliases", ()))):
            if not NAME.fullmatch(value):
                raise RenderError(f"node {node}: networks: {value!r} is not {form}", file=svc.file,
                                  line=svc.lines.get("runtime"))
        if name in repo.vip_networks and not attached:
            continue  # the same VIP addresses in its config, not the network that carries them
        if name in names:
            raise RenderError(f"node {node}: networks: {name!r} named twice", file=svc.file,
                              line=svc.lines.get("runtime"))
        names.append(name)
        aliases += [(name, inline(str(a), "runtime")) for a in spec.get("aliases", ())]
    return tuple(sorted(names)), tuple(sorted(aliases))


def stand_in(repo: DeploymentRepo, node: str, svc: ServiceDef, node_services: Container[str]) -> DesiredService:
    """A service of the node that is not rendered: its name, driver and ``depends_on`` (what the
    planner orders by), no files, no command. Only for a review that knows the service renders
    the same at both commits (``inputs``): both sides get the same stand-in, so it plans "none",
    exactly as the two equal renders would. ``node_services``: the services the node runs."""
    return _stand_in(svc.name, repo.driver_of(node, svc.name),
                     tuple(sorted(d for d in svc.depends_on if d in node_services)), svc.drift,
                     svc.manual or repo.node(node).manual)


@functools.lru_cache(maxsize=4096)
def _stand_in(name: str, driver: str, depends_on: tuple[str, ...], drift: str, manual: bool) -> DesiredService:
    # One object for every node with the same stand-in: its hash (JSON of the runtime and health,
    # most of a plan's cost at 30 services a node) is computed once, not once per node.
    return DesiredService(name=name, runtime=Runtime(driver, ()), files=(), depends_on=depends_on, drift=drift,
                          manual=manual, origin="not rendered: same inputs at both commits")


def render_node(repo: DeploymentRepo, node: str, commit: str, accounts: Accounts | None = None, *,
                limits: Limits | None = None, pinned: Mapping[str, Mapping[str, Any]] | None = None,
                only: Container[str] | None = None) -> Desired:
    """The node's whole slice. Same repo and node, same bytes. Bounded by ``limits`` (the repo's
    by default): time and output for the whole node, output per file (see ``sandbox``).
    ``only``: render these services, and put a ``stand_in`` for the others (a review's diff)."""
    repo.node(node)  # UnknownNode before anything else
    budget = Budget(limits or repo.limits)
    names = repo.services_of(node)
    share = node_share(repo, node) if only is None or any(s in only for s in names) else None
    mine = frozenset(names)
    services = tuple(render_service(repo, node, repo.services[s], accounts, budget=budget,
                                    pinned=(pinned or {}).get(s), share=share)
                     if only is None or s in only else stand_in(repo, node, repo.services[s], mine)
                     for s in names)
    return Desired(node=node, commit=commit, services=services)
