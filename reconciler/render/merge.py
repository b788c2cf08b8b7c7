"""A file with ``merge`` (service.yaml, docs/repo.md "Merged files"): its template rendered,
then each override file of ``from`` that the repo has on this node rendered as a template with
the same variables and merged over it (``mergefmt``: INI as kolla-ansible's ``merge_configs``,
YAML as its ``merge_yaml``), or with ``first_found`` the first override found rendered instead
of the template (Ansible's ``with_first_found``). What a review shows is this result.

The paths of ``from`` are rendered per node one part at a time and must stay in the repo (see
``repo.overrides``, which read the files they may name at load); a path that names no file on
this node is skipped. A merged file's sources render with ``lstrip_blocks`` as kolla's merge
plugins render them: in INI a line that starts with a space continues the value above, so the
indentation before a block tag must go, as it does in kolla.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.core.errors import BadInput, RenderError
from reconciler.core.memo import ByIdentity
from reconciler.core.yamlfile import safe_load
from reconciler.render.environment import CompiledOnce, render_template
from reconciler.render.mergefmt import IniMerge, MergeError, yaml_merge
from reconciler.render.sandbox import Budget, Sandbox
from reconciler.repo.definitions import FileDecl, ServiceDef
from reconciler.repo.overrides import bad_part, path_parts, templated

# Compiled apart from the plain environments: with lstrip_blocks the same source compiles differently.
_CODE = {True: CompiledOnce(1024), False: CompiledOnce(1024)}  # by trim_blocks: the Ansible dialect's or Jinja's
_LSTRIPPED: ByIdentity[Sandbox] = ByIdentity(4096)


def _lstripped(env: Sandbox) -> Sandbox:
    """The service's sandbox with ``lstrip_blocks``: same loader, filters, globals and limits."""
    key = (id(env),)
    hit = _LSTRIPPED.get(key)
    if hit is None:
        hit = env.overlay(lstrip_blocks=True, bytecode_cache=_CODE[env.trim_blocks])
        hit._top = {}  # its own top-level templates: the overlay shares the attribute's dict
        hit = _LSTRIPPED.put(key, hit, env)
    return hit


def render_merged(env: Sandbox, ctx: Mapping[str, Any], svc: ServiceDef, decl: FileDecl, node: str,
                  budget: Budget) -> str:
    """The text of ``decl`` (a file with ``merge``) on ``node``."""
    merge = decl.merge
    assert merge is not None and decl.template is not None
    tpl = svc.template_path(decl.template)

    def render(e: Sandbox, name: str) -> str:
        return render_template(e, ctx, name=name, text=None, file=svc.file, line=decl.line, node=node,
                               service=svc.name, what=decl.path, budget=budget)

    found = [p for p in (_path(env, ctx, svc, decl, text, node, budget) for text in merge.sources)
             if p in env.sources]
    if merge.first_found:
        return render(env, found[0] if found else tpl)
    lenv = _lstripped(env)
    names = [tpl, *found]
    texts = [render(lenv, name) for name in names]
    at = 0  # the source being merged, for the error
    try:
        if merge.format == "ini":
            ini = IniMerge(budget.tick)
            for i, text in enumerate(texts):
                at = i
                ini.add(text)
            return ini.text()
        docs = []
        for i, text in enumerate(texts):
            at = i
            docs.append(_yaml(text, names[i], budget.limits.yaml_nodes))
        return yaml_merge(docs, merge.extend_lists, budget.tick)
    except MergeError as exc:
        line = exc.line
        if exc.index is not None:  # yaml_merge: the document it could not merge
            at, line = exc.index, None
        # A line of the rendered text is the file's own only when rendering changed nothing.
        own = texts[at] == env.sources.get(names[at])
        raise _error(node, svc, decl, names[at], at == 0, str(exc), line, own) from exc


def _yaml(text: str, name: str, max_nodes: int) -> Any:
    try:
        return safe_load(text.encode("utf-8"), name, max_nodes)
    except BadInput as exc:  # invalid YAML, too many nodes: located in its text
        message = str(exc).removeprefix(f"{exc.file}:{exc.line}: " if exc.line else f"{exc.file}: ")
        raise MergeError(message, exc.line) from exc


def _error(node: str, svc: ServiceDef, decl: FileDecl, name: str, template: bool, why: str,
           line: int | None, own: bool) -> RenderError:
    """One line naming the file that would not merge, at its own line when its rendered text is
    its text (``own``), else at its rendered text's line (a template's lines are not its
    output's: a block tag's line goes, a value may span lines)."""
    fmt = decl.merge.format.upper() if decl.merge else ""
    at = f" (line {line} of its rendered text)" if line and not own else ""
    line = line if own else None
    if template:
        return RenderError(f"node {node}, service {svc.name}: {decl.path}: the rendered template is not "
                           f"{fmt}{at}: {why}", file=name, line=line)
    return RenderError(f"node {node}, service {svc.name}: merged into {decl.path}: not {fmt}{at}: {why}",
                       file=name, line=line)


def _path(env: Sandbox, ctx: Mapping[str, Any], svc: ServiceDef, decl: FileDecl, text: str, node: str,
          budget: Budget) -> str:
    """A path of ``from`` as this node reads it, each templated part rendered and checked."""
    parts = []
    for part in path_parts(text):
        if templated(part):
            part = render_template(env, ctx, name=None, text=part, file=svc.file, line=decl.line, node=node,
                                   service=svc.name, what=f"{decl.path}: merge", budget=budget)
            wrong = bad_part(part)
            if wrong:
                raise RenderError(f"node {node}, service {svc.name}: {decl.path}: merge: {text!r} renders "
                                  f"with {wrong}: a merged file stays in the repo", file=svc.file, line=decl.line)
        parts.append(part)
    return "/".join(parts)
