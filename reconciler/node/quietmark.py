"""What a full no-op pass leaves for the next `agent --once` to check (``node.quiet``).

Written by ``node.reconcile.noop`` at the end of a pass that did nothing at all, under the pass
lock, when the command line was a plain `agent --once` (``quiet.ARMED``) and the next full pass
would do nothing either, provided nothing the marker fingerprints changed. Everything that can
make a no-op pass do something and that no fingerprint sees is a reason not to write it: an
outcome that is not the plain no-op, a slice that reads facts, a cutover watched, a note not
pushed, outputs (notify, metrics) to refresh, services of another driver than the process
driver (a container's state is the engine's), a tip probe or a read remote other than the first.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import reconciler
from reconciler.core.atomic import atomic_write
from reconciler.drivers import drivers_in_use
from reconciler.drivers.kinds import kind_of, names
from reconciler.node import quiet, quietlook
from reconciler.node.report import notes_ref
from reconciler.node.run import Request

if TYPE_CHECKING:
    from reconciler.node.context import NodeContext
    from reconciler.node.run import Run, RunResult

log = logging.getLogger("reconciler.agent")


class _Said(logging.Handler):
    """Counts what the pass logged at WARNING or above: a full pass that said something (a
    recovery, a remote that lags, a file swept) is not one the next run may answer silently."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


_SAID = _Said()


def watch_logs() -> None:
    """From the start of a plain `agent --once` that runs the full pass (``entry.main``)."""
    logging.getLogger().addHandler(_SAID)


def remember(ctx: NodeContext, run: Run, result: RunResult, before: str | None) -> None:
    """Write the marker when this pass proves the next one a no-op too; never fails the pass."""
    asked = quiet.ARMED
    try:
        marker = _marker(ctx, run, result, before, asked) if asked is not None else None
        if marker is not None:
            atomic_write(ctx.settings.state_dir / quiet.MARKER, json.dumps(marker, sort_keys=True).encode(), 0o600)
    except Exception as exc:  # the marker is an optimisation: the next pass is a full one
        log.debug("%s: no no-op marker: %s", ctx.node, exc)


def _marker(ctx: NodeContext, run: Run, result: RunResult, before: str | None,
            asked: quiet.Asked) -> dict[str, Any] | None:
    cfg, source, ledger = ctx.settings, ctx.source, ctx.ledger
    if (before is None or run.fetched or run.ask != Request() or result.exit_code != 0 or not result.pushed
            or result.report is not None or result.waiting or ctx.reporter.pending() or _SAID.count):
        return None
    if cfg.notify.enabled or cfg.metrics.listen or cfg.metrics.textfile:
        return None  # ``daemon.afterpass.Outputs`` does something after every pass
    used = ledger.facts_rendered()  # as ``reconcile.facts_changed`` decides whether it gathers
    if used is not None and used[1] and ledger.facts_reads() != frozenset():
        return None
    plane = ledger.plane(run.commit)
    if plane and plane.get("watch") and not plane.get("aborted"):
        return None  # ``peers.cutover_watch`` reads other nodes' notes every pass
    if drivers_in_use(cfg.state_dir) != {"process"} or source.url != source.reads[0] or source.probes.get(source.url):
        return None
    if asked.state_dir.resolve() != cfg.state_dir.resolve():
        return None
    # The services as they were before the pass looked at them, and as they are now: a change
    # while it looked is not proven by its look.
    if quietlook.observed(cfg.state_dir) != before:
        return None
    named = sorted(str(p) for p in _paths(cfg) if p != cfg.state_dir)
    notes = notes_ref(ctx.node)
    tip = source.ref_target(notes)  # ``Reporter.recover`` fetches it when it is gone
    if tip is None:
        return None
    return {"v": quiet.FORMAT, "version": reconciler.__version__, "node": ctx.node, "commit": run.commit,
            "state_dir": str(asked.state_dir), "settings": asked.settings(named), "named": named,
            "observed": before, "ledger": quietlook.ledger_print(cfg.state_dir), "free": int(cfg.min_free_mb * 2**20),
            "url": source.url, "branch": source.branch,
            "env": dict(source.env), "notes": [notes, tip],
            "empty": sorted({kind_of(n).state_dir for n in names()} - {"services"})}


def _paths(value: object) -> list[Path]:
    """Every path the settings name (trust files, keys, identities, the metrics file...)."""
    if isinstance(value, Path):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [p for f in dataclasses.fields(value) for p in _paths(getattr(value, f.name))]
    if isinstance(value, tuple | list | frozenset | set):
        return [p for v in value for p in _paths(v)]
    if isinstance(value, dict):
        return [p for v in value.values() for p in _paths(v)]
    return []
