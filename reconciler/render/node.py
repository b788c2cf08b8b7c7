"""Templates + inventory -> ``Desired`` for one node. Pure: no I/O, no driver; the one clock
read is the render deadline.

The render's parts: ``environment`` (the sandbox a service's templates run in, errors located),
``variables`` (what a template reads, the node's secrets among it), ``runtime`` (the runtime
strings rendered and checked); here, a service's render on a node, and the node's whole slice.

A file whose template reads a secret, or whose content holds a secret's value, is a secret
file: mode 0600 (the owner's bits of its declared mode), and whoever prints it shows only that
it changed. On the node its hash is keyed (``FileSpec.key``, from the data keys of the SOPS
files whose values it holds), so no hash the node shows can confirm a guessed value. Runtime
strings (command, env, health, hooks) may not use secrets: they reach process tables, notes
and logs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.core.errors import RenderError, RenderLimit
from reconciler.core.limits import Limits
from reconciler.core.memo import ByIdentity
from reconciler.core.model import Desired, DesiredService, Runtime
from reconciler.core.model.desired import desired_service, file_spec
from reconciler.drivers.kinds import ACCOUNTS, find
from reconciler.render.environment import render_template, service_environment
from reconciler.render.facts import NodeFacts
from reconciler.render.merge import render_merged
from reconciler.render.runtime import Run, render_runtime
from reconciler.render.sandbox import Budget, Sandbox, budget_in_use
from reconciler.render.variables import (
    NodeShare,
    SecretView,
    context,
    holds_any_secret,
    holds_secret,
    node_share,
    secret_file_key,
    unmark,
)
from reconciler.repo.definitions import DeploymentRepo, ServiceDef


@dataclass(frozen=True)
class _Compiled:
    """What a service definition's renders share on every node: its sandbox (each template
    compiles once however many nodes render it), and its runtime as built for each
    ``(driver, plane, default health timeout, VIP networks)`` when none of its runtime strings
    is a template (``Run``; at 30 services a node, building the runtime per node was a third
    of a fleet diff's render time, for specs that mostly read no variable at all)."""

    env: Sandbox
    runs: dict[tuple[Any, ...], Run]


_COMPILED_SERVICES: ByIdentity[_Compiled] = ByIdentity(4096)


def _compiled(svc: ServiceDef, repo: DeploymentRepo) -> _Compiled:
    """The service definition's entry, keyed by identity (and the repo's template dialect and
    whether its variables are templates)."""
    key = (id(svc), repo.template_dialect, repo.template_variables)
    hit = _COMPILED_SERVICES.get(key)
    if hit is None:
        env = service_environment(svc.templates, svc.template_path("").rstrip("/"), repo.template_dialect,
                                  repo.template_variables)
        hit = _COMPILED_SERVICES.put(key, _Compiled(env, {}), svc)
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
    compiled = _compiled(svc, repo)
    env = compiled.env
    share = share or node_share(repo, node)
    ctx = context(repo, node, svc, pinned, share, env.globals)
    budget = budget or Budget(repo.limits)
    secrets: SecretView = ctx["secrets"]
    files = []
    for decl in svc.files_in_order:
        unmark(secrets)
        if decl.template is not None:
            tpl = svc.template_path(decl.template)
            text = render_template(env, ctx, name=tpl, text=None, file=svc.file, line=decl.line, node=node,
                           service=svc.name, what=decl.path, budget=budget) if decl.merge is None else \
                render_merged(env, ctx, svc, decl, node, budget)  # overrides of the repo merged over it
            try:
                content = text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RenderError(f"node {node}: rendered text is not valid UTF-8 ({exc.reason})", file=tpl) from exc
            # Counted in characters while streaming; a file of wide characters may pass in bytes.
            # (As many bytes as characters: the stream's last count said all there is to say.)
            over = budget.output(len(content) - len(text), len(content), decl.path) \
                if decl.merge is not None or len(content) != len(text) else None
        else:
            assert decl.source is not None
            tpl = svc.source_path(decl.source)
            content = svc.sources[tpl]
            over = budget.output(len(content), len(content), decl.path)
        if over is not None:
            raise RenderLimit(f"node {node}, service {svc.name}: {over}", file=tpl)
        used = holds_secret(secrets, content)
        # Only the owner (the service's user, see the process driver) may read a secret file.
        files.append(file_spec(decl.path, decl.mode & 0o700 if used else decl.mode, content, bool(used),
                               secret_file_key(secrets, used) if used else b""))

    driver = repo.driver_of(node, svc.name)
    timeout = repo.settings.get("defaults", {}).get("health_timeout", 10)
    # Everything the runtime reads besides its strings' variables.
    alike = (driver, share.attached, timeout, repo.vip_networks)
    run = compiled.runs.get(alike)
    unmark(secrets)
    # A plain string that holds one of this node's secret values is refused all the same: the
    # node renders it anew, and the error names the string's key.
    if run is None or holds_any_secret(secrets, run.said):

        def inline(text: str, key: str) -> str:
            unmark(secrets)
            out = render_template(env, ctx, name=None, text=text, file=svc.file, line=svc.lines.get(key), node=node,
                                  service=svc.name, what=key, budget=budget)
            if holds_secret(secrets, out):
                # Never the value: a runtime string reaches ps, notes and logs; a file is private.
                raise RenderError(f"node {node}, service {svc.name}: {key} uses a secret: secrets belong in files "
                                  "(written 0600)", file=svc.file, line=svc.lines.get(key))
            return out

        run = render_runtime(repo, node, svc, driver, share.attached, timeout, inline)
        if not run.templated:
            compiled.runs[alike] = run
    runtime = run.runtime
    runs_as = find(driver) if accounts is not None else None  # a reviewer's render checks no account
    if runs_as is not None and ACCOUNTS in runs_as.checks:  # it runs as the node's users
        for kind, name in (("user", runtime.user), ("group", runtime.group)):
            problem = accounts(kind, name) if accounts is not None and name else None
            if problem:
                raise RenderError(f"node {node}: service {svc.name}: runtime.{kind}: {problem}", file=svc.file,
                                  line=svc.lines.get("runtime"))
    node_services = share.services
    return desired_service(
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


def network_names(repo: DeploymentRepo, node: str, svc: ServiceDef, share: NodeShare | None = None) -> tuple[str, ...]:
    """The names the service's ``networks`` render to on ``node``, a VIP network off the live
    plane too (``render.vipnets`` checks them against ``vip.networks``); only these strings are
    rendered, each in the context the whole render gives it."""
    env = _compiled(svc, repo).env
    ctx = context(repo, node, svc, None, share, env.globals)
    budget = Budget(repo.limits)
    names = (str(e["name"]) if isinstance(e, Mapping) else str(e) for e in svc.container.get("networks", ()))
    return tuple(render_template(env, ctx, name=None, text=text, file=svc.file, line=svc.lines.get("runtime"),
                                 node=node, service=svc.name, what="runtime", budget=budget) for text in names)


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
                only: Container[str] | None = None, facts: NodeFacts | None = None) -> Desired:
    """The node's whole slice. Same repo, node and facts, same bytes. Bounded by ``limits`` (the
    repo's by default): time and output for the whole node, output per file (see ``sandbox``).
    ``only``: render these services, and put a ``stand_in`` for the others (a review's diff).
    ``facts``: the node's (``render.facts``: it notes whether a template read them)."""
    repo.node(node)  # UnknownNode before anything else
    budget = Budget(limits or repo.limits)
    names = repo.services_of(node)
    share = node_share(repo, node, facts) if only is None or any(s in only for s in names) else None
    standing = {} if only is None else _stand_ins(repo, node, names, only)
    with budget_in_use(budget):  # once for the node's files, not once a file
        services = tuple(render_service(repo, node, repo.services[s], accounts, budget=budget,
                                        pinned=(pinned or {}).get(s), share=share)
                         if only is None or s in only else standing[s]
                         for s in names)
    return Desired(node=node, commit=commit, services=services)


_STAND_INS: ByIdentity[Mapping[str, DesiredService]] = ByIdentity(1024)


def _stand_ins(repo: DeploymentRepo, node: str, names: tuple[str, ...],
               only: Container[str]) -> Mapping[str, DesiredService]:
    """The stand-ins of the node's services not in ``only``. A stand-in reads the node's
    services, driver and ``manual`` only: the nodes of a group share them, made once for all."""
    nd = repo.node(node)
    key = (id(repo), names, nd.driver, nd.manual, only) if isinstance(only, frozenset) else None
    hit = _STAND_INS.get(key) if key is not None else None
    if hit is None:
        mine = frozenset(names)
        hit = {s: stand_in(repo, node, repo.services[s], mine) for s in names if s not in only}
        if key is not None:
            _STAND_INS.put(key, hit, repo)
    return hit
