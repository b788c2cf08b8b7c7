"""The planner as data: each file in plan_cases/ is desired and observed in, actions out.

Adding a case is adding a file. A case names services with their files' contents; observed
services are built from the same description, so their hashes are real hashes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.core.model import (
    ActionKind,
    Desired,
    DesiredService,
    FileSpec,
    Observed,
    ObservedService,
    Rule,
    Runtime,
)
from reconciler.plan.planner import plan

CASES = sorted((Path(__file__).parent / "plan_cases").glob("*.yaml"))


def _service(name: str, spec: dict[str, Any]) -> DesiredService:
    return DesiredService(
        name=name,
        runtime=Runtime(spec.get("driver", "process"), tuple(spec.get("command", ["run", name]))),
        files=tuple(FileSpec(p, 0o644, str(c).encode()) for p, c in sorted(spec.get("files", {}).items())),
        depends_on=tuple(spec.get("depends_on", [])),
        rules=tuple(Rule(r["file"], ActionKind(r["action"]), tuple(r.get("keys", []))) for r in spec.get("rules", [])),
    )


def _observed(name: str, spec: dict[str, Any]) -> ObservedService:
    svc = _service(name, spec)
    return ObservedService(
        name=name, driver=svc.runtime.driver, running=spec.get("running", True), hash=svc.hash,
        commit=spec.get("commit", "c0ffee"), pid=1234, fingerprint=tuple(sorted(svc.fingerprint().items())),
        files=svc.files,
    )


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_plan_case(case: Path) -> None:
    data = yaml.safe_load(case.read_text())
    wanted = sorted((data.get("desired") or {}).items())
    seen = sorted((data.get("observed") or {}).items())
    desired = Desired("node1", "c1", tuple(_service(n, s or {}) for n, s in wanted))
    observed = Observed("node1", tuple(_observed(n, s or {}) for n, s in seen))

    got = plan(desired, observed)

    assert [[str(a.kind), a.service, a.reason] for a in got.actions] == data["expect"], data.get("description")
    assert plan(desired, observed) == got, "same input, same plan"
