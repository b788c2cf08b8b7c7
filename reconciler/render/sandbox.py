"""The Jinja sandbox templates run in, holding each node's render to its ``Limits``.

Jinja's own sandbox stops a template from reaching Python's internals and caps one ``range()``
at 100,000 items, but two nested loops still run 10**10 times, and ``'x' * 10**10`` or a string
doubled in a loop asks for gigabytes in one step. So, during one node's render:

- time: a deadline, checked every few hundred steps, where a step is a loop iteration (every
  ``{% for %}`` iterates through ``Sandbox.paced``, which the code generator wraps around it),
  a call, an attribute or item lookup, an operator or a chunk of output: a loop that prints
  nothing stops as surely as one that prints;
- output: counted as it is generated (see ``render._stream``), per file and per node;
- values: an operation whose result would pass ``file_bytes`` (repeat, concatenate, pad,
  format widths, replace, huge powers) is refused before it is built; a result that passes it
  anyway (a macro's output) is refused once built; a list or dict is measured at its printed
  size (``sizes.printed_size``) before ``{{ }}``, ``~``, ``%``, ``format`` or a filter prints it;
- depth: an include, import or extends nested deeper than ``include_depth`` is refused.

A limit passed raises ``RenderLimit`` inside the template, so the error carries its line.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from contextvars import ContextVar
from types import FrameType
from typing import Any

import jinja2
import jinja2.sandbox
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst

from reconciler.core.errors import RenderLimit
from reconciler.core.limits import Limits, size
from reconciler.render.sizes import (
    CONTAINER_TYPES,
    CONTAINERS,
    GROWING,
    MOST_BITS,
    NUMBERS,
    format_width,
    printed_size,
    result_size,
    weight,
)

# Exactly these types (a subclass is measured) hold no container to measure before printing.
_SCALARS = frozenset({str, int, bool, float, type(None)})
_CHECK_EVERY = 256  # steps between clock reads: cheap, and still many checks per second
_MADE_PER_OUTPUT = 4  # the strings a render builds, against the output it may write


class Budget:
    """What one node's render may still spend; every template of the node draws on it."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.render_seconds
        self.spent = 0  # output of the node so far (characters while streaming, then bytes)
        self.steps = 0
        self.made = 0  # characters of the strings its filters and methods returned

    @property
    def too_late(self) -> str:
        return f"rendering took longer than {self.limits.render_seconds:g} s (render limit)"

    def late(self) -> str | None:
        self.steps += 1
        if self.steps % _CHECK_EVERY == 0 and time.monotonic() > self.deadline:
            return self.too_late
        return None

    def tick(self) -> None:
        # ``late`` inlined: every lookup, call and operator of a template ticks.
        self.steps += 1
        if self.steps % _CHECK_EVERY == 0 and time.monotonic() > self.deadline:
            raise RenderLimit(self.too_late)

    def value(self, length: int) -> None:
        if length > self.limits.file_bytes:
            raise RenderLimit(f"a value larger than {size(self.limits.file_bytes)} (render limit)")

    def built(self, length: int) -> None:
        """A string a filter or method returned: held to ``file_bytes``, and all of them to a few
        ``node_bytes`` (a ``map`` over a long list keeps each one it builds, output or not)."""
        self.value(length)
        self.made += length
        if self.made > _MADE_PER_OUTPUT * self.limits.node_bytes:
            raise RenderLimit(f"the values built add up to more than {size(_MADE_PER_OUTPUT * self.limits.node_bytes)}"
                              " (render limit)")

    def output(self, more: int, file_so_far: int, what: str) -> str | None:
        """Count ``more`` output of the node; why it must stop, if it must."""
        self.spent += more
        if file_so_far > self.limits.file_bytes:
            return f"{what} is larger than {size(self.limits.file_bytes)} (render limit)"
        if self.spent > self.limits.node_bytes:
            return f"the node's files are larger than {size(self.limits.node_bytes)} (render limit)"
        return self.too_late if time.monotonic() > self.deadline else None


_BUDGET: ContextVar[Budget | None] = ContextVar("render_budget", default=None)


class budget_in_use:  # noqa: N801 (used as a function: ``with budget_in_use(budget):``)
    """The budget every hook of the sandbox draws on while a template runs. A class, not a
    generator under ``contextlib.contextmanager``: entered once per rendered file, 60,000
    times in a fleet diff, where the generator's machinery was a fortieth of the time."""

    __slots__ = ("budget", "token")

    def __init__(self, budget: Budget) -> None:
        self.budget = budget

    def __enter__(self) -> None:
        self.token = _BUDGET.set(self.budget)

    def __exit__(self, *exc: object) -> None:
        _BUDGET.reset(self.token)


def budget_now() -> Budget | None:
    """The budget of the render under way (None outside one): a templated variable's value
    (``lazyvars``) is held to its value limit as it is built."""
    return _BUDGET.get()


# Filters that pass a container on or look into it, never print it: not measured (``length``
# in a loop over a long list would walk it each time).
_STRUCTURAL = frozenset({"attr", "batch", "combine", "count", "d", "default", "dict2items", "dictsort", "difference",
                         "first", "flatten", "groupby", "intersect", "items", "items2dict", "last", "length", "list",
                         "map", "mandatory", "max", "min", "reject", "rejectattr", "reverse", "select", "selectattr",
                         "slice", "sort", "sum", "symmetric_difference", "union", "unique", "zip", "zip_longest"})


def _printed(budget: Budget, *values: Any) -> None:
    """Refuse values whose text would pass the value limit, before any of it is built."""
    total = 0
    for v in values:
        if type(v) in CONTAINER_TYPES or isinstance(v, CONTAINERS):
            total += printed_size(v, budget.limits.file_bytes)
        elif type(v) is str:
            total += len(v)
    budget.value(total)


def _paced_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    skip = 1 if hasattr(func, "jinja_pass_arg") else 0  # @pass_context and kin take that first
    grows = name in GROWING
    # ansible.builtin.combine is combine; ``_join`` measures only a list that is not all strings.
    prints = name.rsplit(".", 1)[-1] not in _STRUCTURAL and func is not _join

    @functools.wraps(func)  # keeps jinja_pass_arg, so Jinja passes the same arguments
    def paced(*args: Any, **kwargs: Any) -> Any:
        budget = _BUDGET.get()
        if budget is None:
            return func(*args, **kwargs)
        budget.tick()
        if grows and len(args) > skip:
            budget.value(result_size(name, args[skip], args[skip + 1:], kwargs))
        if prints:
            _printed(budget, *args[skip:], *kwargs.values())
        result = func(*args, **kwargs)
        if isinstance(result, str):
            budget.built(len(result))
        return result

    return paced


def _measured_test(func: Callable[..., bool]) -> Callable[..., bool]:
    @functools.wraps(func)  # keeps jinja_pass_arg
    def measured(*args: Any, **kwargs: Any) -> bool:
        budget = _BUDGET.get()
        if budget is not None:
            budget.tick()
            _printed(budget, *args, *kwargs.values())
        return func(*args, **kwargs)

    return measured


class _Generator(CodeGenerator):
    """Jinja's code generator with two hooks the sandbox cannot otherwise see: every loop
    iterates through ``environment.paced``, and ``~`` joins through ``environment.joined``."""

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        node.iter = nodes.Call(nodes.EnvironmentAttribute("paced"), [node.iter], [], None, None,
                               lineno=node.iter.lineno)
        super().visit_For(node, frame)

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        # As CodeGenerator.visit_Concat, with the join function passed to environment.joined.
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        else:
            join = "markup_join" if frame.eval_ctx.autoescape else "str_join"
        self.write("environment.joined((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write(f"), {join})")


@jinja2.pass_environment
def _sum(environment: jinja2.Environment, iterable: Iterable[Any], attribute: str | int | None = None,
         start: Any = 0) -> Any:
    """Jinja's ``sum``, bounded: a sum of lists (``start=[]``) is one call, quadratic in their
    number, out of reach of the deadline; so lists and tuples are weighed, then joined in one pass."""
    if attribute is not None:
        iterable = map(jinja2.filters.make_attrgetter(environment, attribute), iterable)
    items = list(iterable)
    kind = type(start)
    if kind in (list, tuple) and all(type(item) is kind for item in items):
        budget = _BUDGET.get()
        if budget is not None:
            budget.value(weight(start) + sum([weight(item) for item in items]))
        joined = [*start, *(x for item in items for x in item)]
        return joined if kind is list else tuple(joined)
    return sum(items, start)


@jinja2.pass_eval_context
def _join(eval_ctx: jinja2.nodes.EvalContext, value: Iterable[Any], d: str = "",
          attribute: str | int | None = None) -> str:
    """Jinja's ``join``, without a ``str()`` call per item when every item is a string already
    (a group's member names: at 250 names a file, most of rendering a fleet's configs). A
    string's ``str()`` is itself; a list with anything else in it takes Jinja's way."""
    if attribute is None and not eval_ctx.autoescape and type(value) in (list, tuple):
        try:
            return str(d).join(value)
        except TypeError:
            pass
    budget = _BUDGET.get()
    if budget is not None:
        value = value if type(value) in (list, tuple) else list(value)
        _printed(budget, value)
    return jinja2.filters.sync_do_join(eval_ctx, value, d, attribute)


class Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, paced and bounded by the ``Budget`` in use (none: unbounded)."""

    code_generator_class = _Generator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any) -> None:
        # ``{{ x }}`` prints through ``finalize``: a container is measured before ``str()``.
        options.setdefault("finalize", self._printable)
        super().__init__(**options)
        # lipsum(n) loops n times in plain Python, out of reach of every check here.
        self.globals.pop("lipsum", None)
        own = {**self.filters, "join": _join, "sum": _sum}
        self.filters = {name: _paced_filter(name, f) for name, f in own.items()}
        self.over_limit: MutableMapping[str, str] = {}  # template -> first node it passed a limit for
        self._top: dict[str, jinja2.Template] = {}

    def add_filters(self, filters: Mapping[str, Callable[..., Any]]) -> None:
        """More filters (a template dialect's), paced and bounded like Jinja's own."""
        self.filters.update({name: _paced_filter(name, f) for name, f in filters.items()})

    def add_tests(self, tests: Mapping[str, Callable[..., bool]]) -> None:
        """More tests (a dialect's): one that reads its value as text (``match``, ``version``)
        has it measured first, as a filter's is."""
        self.tests.update({name: _measured_test(t) for name, t in tests.items()})

    @property
    def sources(self) -> Mapping[str, str]:
        """Repo path -> text of every template this environment can load."""
        loaded: Mapping[str, str] = getattr(self.loader, "sources", {})
        return loaded

    def paced(self, iterable: Iterable[Any]) -> Iterator[Any]:
        budget = _BUDGET.get()
        if budget is None:
            yield from iterable
            return
        # The clock is read as each loop starts and every few hundred items: nested loops
        # check at each start of the inner one, and the hot path stays a counter.
        for i, item in enumerate(iterable):
            if i % _CHECK_EVERY == 0 and time.monotonic() > budget.deadline:
                raise RenderLimit(budget.too_late)
            yield item

    @staticmethod
    def _printable(value: Any) -> Any:
        if type(value) in _SCALARS:  # most of what a config prints: nothing to measure (one set lookup)
            return value
        if isinstance(value, CONTAINERS):
            budget = _BUDGET.get()
            if budget is not None:
                _printed(budget, value)
        return value

    def joined(self, parts: Sequence[Any], join: Callable[[Sequence[Any]], str]) -> str:
        budget = _BUDGET.get()
        if budget is not None:
            budget.tick()
            _printed(budget, *parts)
        return join(parts)

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        budget = _BUDGET.get()
        if budget is not None:
            budget.tick()
            # Two numbers make nothing large but a power or a product of large integers (a
            # port_base + 1 on every line of a fleet skips the rest).
            if operator == "**" or type(left) not in NUMBERS or type(right) not in NUMBERS:
                budget.value(self._binop_size(operator, left, right))
                if operator == "%" and isinstance(left, str):
                    _printed(budget, left, *(right if type(right) is tuple else (right,)))
            elif operator == "*" and type(left) is int and type(right) is int \
                    and left.bit_length() + right.bit_length() > MOST_BITS:
                budget.value(sys.maxsize)  # squared in a loop, a number takes minutes to multiply
        return super().call_binop(context, operator, left, right)

    @staticmethod
    def _binop_size(operator: str, left: Any, right: Any) -> int:
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(times, int) and isinstance(seq, (str, list, tuple)):
                    return weight(seq) * times
        if operator == "+":
            return weight(left) + weight(right)
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            # Bytes of the result (``_MOST_BITS``): computing a larger one first could take minutes.
            bits = right * max(left.bit_length() - 1, 0)
            return bits // 8 if bits <= MOST_BITS else sys.maxsize
        if operator == "%" and isinstance(left, str):
            return len(left) + format_width(left, right if isinstance(right, tuple) else (right,))
        return 0

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = _BUDGET.get()
        if budget is None:
            return super().call(__context, __obj, *args, **kwargs)
        budget.tick()
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):  # a string method: "x".center(10 ** 9)
            budget.value(result_size(getattr(__obj, "__name__", ""), owner, args, kwargs))
        result = super().call(__context, __obj, *args, **kwargs)
        if isinstance(result, str):
            budget.built(len(result))
        return result

    def getattr(self, obj: Any, attribute: str) -> Any:
        budget = _BUDGET.get()
        if budget is not None:
            budget.tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        budget = _BUDGET.get()
        if budget is not None:
            budget.tick()
        return super().getitem(obj, argument)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        fmt = super().wrap_str_format(value)
        if fmt is None:
            return None
        spec: str = value.__self__

        @functools.wraps(fmt)
        def bounded(*args: Any, **kwargs: Any) -> str:
            budget = _BUDGET.get()
            if budget is not None:
                budget.value(len(spec) + format_width(spec, (*args, *kwargs.values())))
                _printed(budget, spec, *args, *kwargs.values())
            return fmt(*args, **kwargs)

        return bounded

    def file_template(self, name: str) -> jinja2.Template:
        """A service's file template, loaded at the top (no include depth to check there): the
        cache lookup of ``get_template`` (lock, weakref, the stack walk below) once per name."""
        tpl = self._top.get(name)
        if tpl is None:
            tpl = self._top[name] = self.get_template(name)
        return tpl

    def get_template(self, name: str | jinja2.Template, parent: str | None = None,
                     globals: MutableMapping[str, Any] | None = None) -> jinja2.Template:
        budget = _BUDGET.get()
        if budget is not None:
            # Called from a running template for include, import and extends: each template
            # nested on the stack runs in a frame of its compiled ``root`` function.
            sources = self.sources
            depth = 0
            frame: FrameType | None = sys._getframe(1)
            while frame is not None:
                depth += frame.f_code.co_name == "root" and frame.f_code.co_filename in sources
                frame = frame.f_back
            if depth > budget.limits.include_depth:
                raise RenderLimit(f"includes nest deeper than {budget.limits.include_depth} (render limit)")
        return super().get_template(name, parent, globals)
