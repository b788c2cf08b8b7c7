"""Secret values out of what the agent captures: a service's output, a step's, a hook's.

A service may print its own password (a debug line, a config dump, a failed login that echoes
what it sent). The agent keeps such output where it explains a failure: the error of an action
(``ApplyError.output``), the history database, the note, the log, an upgrade step's record,
the command line's report. Every one of those goes through a ``Redactor`` first, which
replaces each secret value the node decrypted by ``<secret NAME>``.

A plan's reasons name the keys of a changed file, and a template may use a secret as a key (an
INI file keyed by credential): the node redacts each plan as it is made (``Redactor.plan``),
before it is hashed, shown (``-o json``), logged or noted.

Pure: text in, text out. The one cleaner of secret values: the agent builds it from the values
of every repo it decrypted (``render.secrets.secret_values``, the one list of them) and wires it
into the ledger, the apply stage and the upgrader.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from reconciler.core.model import Plan, Report, ServiceResult, StepRecord

# A line of a multi-line value (a PEM key, a certificate) is looked for alone too, from this
# many characters: a program that prints the value prints it line by line, and a captured
# output joins the lines with " | ". Shorter lines ("-----END", "") would match by chance.
LINE_MIN = 16

_USERINFO = re.compile(r"\b([a-z][a-z0-9+.-]*://)[^@/\s]*@", re.IGNORECASE)


def without_userinfo(text: str) -> str:
    """``text`` with the user and password of every URL in it (``https://user:pass@host``)
    taken out, as Flux does in its errors: git's, a registry's, an engine's words reach notes
    and logs."""
    return _USERINFO.sub(r"\1", text)


@dataclass(frozen=True)
class Redactor:
    """Replaces every known secret value in a text by ``<secret NAME>``, in one pass (a marker
    is never redacted again), longest value first (a value that contains another is replaced
    whole). Every non-empty value counts, however short: a secret's value never shows, even
    if a short one makes an output read oddly."""

    # (value, name) pairs, longest value first; never printed (see __repr__).
    known: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @staticmethod
    def of(named: Iterable[tuple[str, str]]) -> Redactor:
        """From (dotted name, value as text) pairs, e.g. of ``secrets.secret_values``."""
        return Redactor().plus(named)

    def plus(self, named: Iterable[tuple[str, str]]) -> Redactor:
        """This one and more values: a value decrypted once stays redacted (a service still
        running the old password prints the old password)."""
        known = dict((v, n) for v, n in self.known)
        for name, value in named:
            pieces = [value, *(line.strip() for line in value.splitlines() if len(line.strip()) >= LINE_MIN)]
            for piece in pieces:
                if piece:
                    known.setdefault(piece, name)
        if len(known) == len(self.known):
            return self
        return Redactor(tuple(sorted(known.items(), key=lambda kv: (-len(kv[0]), kv[0]))))

    @functools.cached_property
    def _pattern(self) -> re.Pattern[str] | None:
        """One alternation of the values, longest first, compiled once."""
        return re.compile("|".join(re.escape(v) for v, _ in self.known)) if self.known else None

    def __call__(self, text: str) -> str:
        pattern = self._pattern
        if pattern is None or not text:
            return text
        names = dict(self.known)
        return pattern.sub(lambda m: f"<secret {names[m.group(0)]}>", text)

    def __bool__(self) -> bool:
        return bool(self.known)

    def __repr__(self) -> str:
        return f"Redactor({len(self.known)} values)"

    def result(self, r: ServiceResult) -> ServiceResult:
        return replace(r, reason=self(r.reason), detail=self(r.detail), steps=tuple(self(s) for s in r.steps))

    def plan(self, plan: Plan) -> Plan:
        """The plan with its reasons and waits redacted (a secret used as an INI key is named in
        a reason). Redacted before anything hashes it: the note's plan hash of a reason with the
        value in it would confirm a guess of the value."""
        if not self:
            return plan
        return replace(plan, actions=tuple(replace(a, reason=self(a.reason), waiting=self(a.waiting))
                                           for a in plan.actions))

    def step(self, s: StepRecord) -> StepRecord:
        return replace(s, detail=self(s.detail))

    def report(self, report: Report) -> Report:
        """Every free text of a run's report: errors, service details, events, step records."""
        if not self:
            return report
        return replace(report, error=self(report.error), events=tuple(self(e) for e in report.events),
                       services=tuple(self.result(r) for r in report.services),
                       steps=tuple(self.step(s) for s in report.steps))


NONE = Redactor()
