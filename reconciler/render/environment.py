"""The sandboxed Jinja environment a service's templates run in, and rendering one template
(a file's, or an inline runtime string) with every error located.

Templates run in Jinja2's immutable sandbox with ``StrictUndefined``: a template cannot call
unsafe attributes or mutate its inputs, and a missing variable is an error naming the file and
line, never an empty string on a production node. The sandbox also holds each node to
``Limits`` (time, output, value sizes, include depth; see ``sandbox``): past one, the node's
render is a ``RenderLimit`` naming template, line, node and service.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Generator, Mapping
from pathlib import PurePosixPath
from types import TracebackType
from typing import Any, cast

import jinja2
import jinja2.bccache
import jinja2.sandbox

from reconciler.core.errors import RenderError, RenderLimit
from reconciler.core.memo import ByIdentity
from reconciler.render import lazyvars
from reconciler.render.lazyvars import LazyContext, VarError
from reconciler.render.sandbox import Budget, Sandbox, budget_in_use, budget_now
from reconciler.render.secrets import SecretUnreadable


class _RepoLoader(jinja2.BaseLoader):
    """Templates by their repo path, so errors name ``services/x/templates/y.j2``. An include or
    import names a template relative to the service's templates/ (or by its repo path); a name
    with ``..`` or a leading ``/`` is not found: a template reads only the files its service
    already loaded (no symlink among them, see ``repo.tree``), never the disk: its own service's
    templates and, by their repo path, the override files its ``merge`` entries may read
    (``repo.overrides``), which the service's files read anyway."""

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


class CompiledOnce(jinja2.BytecodeCache):
    """Compiled templates kept in memory by name and source: the same template at both commits
    of a diff (two service definitions, two environments) is parsed and compiled once. Every
    environment given one cache has the same options, so the code is the same; environments
    whose options differ (``render.merge``'s ``lstrip_blocks``) take a cache of their own."""

    def __init__(self, keep: int = 4096) -> None:
        self.keep = keep
        self.code: dict[str, tuple[str, Any]] = {}

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        hit = self.code.get(bucket.key)
        if hit is not None and hit[0] == bucket.checksum:
            bucket.code = hit[1]

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        if len(self.code) > self.keep:
            self.code.clear()
        self.code[bucket.key] = (bucket.checksum, bucket.code)


# One per template dialect: compiled code names the filters it found (a template that uses
# ``bool`` compiles to an error without the Ansible dialect), so it is reused only within one.
_COMPILED = {"jinja": CompiledOnce(), "ansible": CompiledOnce()}


def service_environment(templates: Mapping[str, str], base: str, dialect: str = "jinja",
                        templated: bool = False) -> Sandbox:
    """A service definition's sandbox: its templates by repo path, compiled once (see
    ``CompiledOnce``), with the filters, tests and globals of the repo's template ``dialect``
    (reconciler.yaml ``templates.dialect``: Jinja's own, or Ansible's, see ``ansible_dialect``).
    ``templated``: the repo's variables may be templates, rendered when read (``lazyvars``)."""
    env = Sandbox(
        loader=_RepoLoader(templates, base),
        bytecode_cache=_COMPILED[dialect],
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        # The sources never change under an environment (one per service definition): no
        # up-to-date check on every get_template, a sixth of a diff's render time at scale.
        auto_reload=False,
    )
    if dialect == "ansible":
        from reconciler.render.ansible_extras import install

        install(env)
    if templated:
        env.context_class = LazyContext
    return env


# A peer's templated values (hostvars) render in a sandbox of their own, made here: lazyvars
# cannot import this module, which imports it.
lazyvars.make_environment = lambda dialect: service_environment({}, "hostvars", dialect, templated=True)


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
    context = tpl.environment.context_class(tpl.environment, cast(dict[str, Any], ctx), tpl.name, tpl.blocks)
    chunks: list[str] = []
    append = chunks.append
    size, counted = 0, 0
    # Output is often one character per chunk: count it here, and let the budget judge it only
    # every so many bytes or once this file passes its limit (``check``: the size at which it
    # is next asked; one comparison a chunk, a fleet diff yields some 800,000).
    limit = budget.limits.file_bytes
    batch = min(64 * 1024, limit)
    check = min(batch, limit + 1)
    gen = cast(Generator[str, None, None], tpl.root_render_func(context))  # a compiled template is a generator
    try:
        for chunk in gen:
            size += len(chunk)
            if size >= check:
                over = budget.output(size - counted, size, what)
                counted, check = size, min(size + batch, limit + 1)
                if over is not None:
                    # Thrown into the template, so the error carries the line that was printing.
                    gen.throw(RenderLimit(over))
            append(chunk)
    except Exception:
        # Rewrites the traceback so template frames carry the template's file and line.
        tpl.environment.handle_exception()
    over = budget.output(size - counted, size, what)
    if over is not None:
        raise RenderLimit(over)
    return "".join(chunks)


def _render(env: Sandbox, name: str | None, text: str | None, ctx: Mapping[str, Any], budget: Budget, what: str) -> str:
    tpl = env.file_template(name) if name else _inline_template(env, text or "")
    return _stream(tpl, ctx, budget, what)


def render_template(
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
        if budget_now() is budget:  # the node's render holds it for all its files (``render_node``)
            return _render(env, name, text, ctx, budget, what)
        with budget_in_use(budget):
            return _render(env, name, text, ctx, budget, what)
    except RenderLimit as exc:
        # A loop that ran too long for one node runs as long for the next: the others of a
        # `validate` over the fleet are refused at once, naming the node it was measured on.
        if name is not None:
            env.over_limit.setdefault(name, node)
        where, at = _template_where(exc.__traceback__, sources) or ((name, None) if name else (file, line))
        raise RenderLimit(f"node {node}, service {service}: {exc}", file=where, line=at) from exc
    except VarError as exc:  # a templated variable: where it is written, and the chain that read it
        where, at = _template_where(exc.__traceback__, sources) or ((name, None) if name else (file, line))
        reader = f"{where}:{at}" if at else str(where)
        raise RenderError(f"node {node}, service {service}: {exc.chain(reader)}", file=exc.file,
                          line=exc.line) from exc
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
