"""What passes between the stages of the loop: plain, frozen, serialisable data.

No I/O here. Every object has ``to_dict`` so a note, a test or ``-o json`` can print it.

This ``__init__`` is the package's face, on purpose: every stage imports its data from
``reconciler.core.model``, whichever module defines it. The modules, in the loop's order:
``desired`` (the slice render makes, and its hashes), ``plans`` (what the drivers observe, and
the plan to the slice), ``runs`` (a commit's run: its revision, results, step records, verdict
and report).
"""

from reconciler.core.model.desired import (
    LADDER,
    MIN_HEALTHY,
    ActionKind,
    Desired,
    DesiredService,
    FileSpec,
    Health,
    Reload,
    Rule,
    Runtime,
    canonical_json,
    rank,
    sha256_hex,
)
from reconciler.core.model.plans import Action, Observed, ObservedService, Plan
from reconciler.core.model.runs import (
    PASSED,
    Report,
    ResultState,
    Revision,
    RunState,
    Scope,
    ServiceResult,
    StepRecord,
    StepStatus,
    Verdict,
    VerifiedRevision,
)

__all__ = [
    "LADDER", "MIN_HEALTHY", "PASSED", "Action", "ActionKind", "Desired", "DesiredService", "FileSpec", "Health",
    "Observed", "ObservedService", "Plan", "Reload", "Report", "ResultState", "Revision", "Rule", "RunState",
    "Runtime", "Scope", "ServiceResult", "StepRecord", "StepStatus", "Verdict", "VerifiedRevision",
    "canonical_json", "rank", "sha256_hex",
]
