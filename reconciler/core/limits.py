"""How much a commit may ask of the machine that loads and renders it.

A deployment repo is reviewed, but review reads text, not its cost: ten lines of Jinja or YAML
can ask for gigabytes or hours. Every bound lives here, so ``validate`` on a laptop, ``diff`` in
CI and the agent on a node refuse the same commit, with the same located error.
"""

from __future__ import annotations

from dataclasses import dataclass

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class Limits:
    yaml_nodes: int = 1_000_000
    """Values in one YAML document (keys, scalars, lists, maps), aliases counted at their
    expanded size: what a billion-laughs document costs whoever walks it."""

    file_bytes: int = 10 * MiB
    """One file read from the repo, one rendered file, and any value a template builds."""

    node_bytes: int = 100 * MiB
    """All the files and strings rendered for one node."""

    render_seconds: float = 30.0
    """Time to render one node, checked as templates run (loops, calls, output)."""

    include_depth: int = 10
    """Nested {% include %}, {% import %} and {% extends %} below the rendered template."""


LIMITS = Limits()


def size(n: float) -> str:
    """A byte count as people write limits: 10 MiB, 64 KiB, 1000 B."""
    for unit, scale in (("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{int(n // scale)} {unit}"
    return f"{int(n)} B"
