"""The threat model's lines are backed by tests: every test it names exists, so a renamed or
removed test cannot leave a claim standing with nothing behind it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = (ROOT / "docs" / "threat-model.md", ROOT / "docs" / "crash-safety.md")


def test_every_test_the_threat_model_and_the_crash_safety_page_name_exists() -> None:
    named = 0
    for doc in DOCS:
        text = doc.read_text()
        for path, name in re.findall(r"(tests/test_\w+\.py)(?:::(\w+))?", text):
            source = (ROOT / path).read_text() if (ROOT / path).is_file() else None
            assert source is not None, f"{doc.name} names {path}, which does not exist"
            if name:
                assert re.search(rf"^def {name}\b", source, flags=re.M), f"{doc.name} names {path}::{name}"
            named += 1
        for short in re.findall(r"`::(\w+)", text):  # `::name` after a full one: a test of the same file
            assert any(re.search(rf"^def {short}\b", p.read_text(), flags=re.M)
                       for p in (ROOT / "tests").glob("test_*.py")), f"{doc.name} names ::{short}"
    assert named > 20
