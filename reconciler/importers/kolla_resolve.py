"""Import-time resolution of kolla's variables, for what must be a value in the repo's files
rather than a template: whether a service is enabled, the list of its volumes, its
healthcheck's numbers. A name resolves to its raw value (a list or mapping as written, its
strings left as templates) unless it is itself a template string, which is resolved in turn.
What needs a node (facts, addresses, hostvars) or a filter kolla gets from Ansible that is not
here cannot be resolved: ``Unresolved`` says why, and the caller keeps the template.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.core.errors import ReconcilerError


class Unresolved(ReconcilerError):
    """A value that cannot be known at import time: the name or filter it needs."""


def to_bool(value: Any) -> bool:
    """Ansible's ``bool`` filter."""
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "on", "y")


def templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


class Resolver:
    def __init__(self, variables: Mapping[str, Any]) -> None:
        from jinja2 import StrictUndefined
        from jinja2.nativetypes import NativeEnvironment

        self.variables = variables
        self.env = NativeEnvironment(undefined=StrictUndefined)
        self.env.filters.update(bool=to_bool, ternary=lambda v, a, b, n=None: a if to_bool(v) else b)
        self.env.globals["lookup"] = self._lookup
        self.memo: dict[str, Any] = {}
        self.stack: list[str] = []

    def name(self, name: str, extra: Mapping[str, Any] | None = None) -> Any:
        if extra and name in extra:
            return extra[name]
        if name in self.memo:
            return self.memo[name]
        if name not in self.variables:
            raise Unresolved(f"{name} is not defined at import time (a fact, a task-set variable or a "
                             "node's address)")
        if name in self.stack:
            raise Unresolved(f"{' -> '.join(self.stack + [name])}: a cycle")
        self.stack.append(name)
        try:
            raw = self.variables[name]
            value = self.expr(raw) if templated(raw) else raw
        finally:
            self.stack.pop()
        self.memo[name] = value
        return value

    def _lookup(self, kind: str, *terms: str, **_options: Any) -> Any:
        """``lookup('vars', NAME)``, the one lookup kolla's defaults use to pick a variable."""
        if kind != "vars" or len(terms) != 1:
            raise Unresolved(f"lookup({kind!r}, ...) is not known at import time")
        return self.name(terms[0])

    def expr(self, text: str, extra: Mapping[str, Any] | None = None) -> Any:
        """``text`` rendered with Jinja's native types, each name it reads resolved first."""
        from jinja2 import TemplateError, meta

        try:
            names = meta.find_undeclared_variables(self.env.parse(text))
            context = {n: self.name(n, extra) for n in sorted(names) if n not in self.env.globals}
            return self.env.from_string(text).render(context)
        except TemplateError as exc:
            raise Unresolved(f"{type(exc).__name__}: {exc}") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            raise Unresolved(f"{type(exc).__name__}: {exc}") from None

    def value(self, raw: Any, extra: Mapping[str, Any] | None = None) -> Any:
        """A value as written: rendered when it is a template string, else as it is."""
        return self.expr(raw, extra) if templated(raw) else raw

    def deep(self, raw: Any, extra: Mapping[str, Any] | None = None) -> Any:
        """Every string inside ``raw`` rendered (for numbers a schema needs as numbers)."""
        value = self.value(raw, extra)
        if isinstance(value, dict):
            return {k: self.deep(v, extra) for k, v in value.items()}
        if isinstance(value, list):
            return [self.deep(v, extra) for v in value]
        return value
