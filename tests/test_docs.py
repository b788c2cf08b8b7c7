"""The documentation site cannot drift: its generated references are what the code says now,
it builds strictly (no broken link or anchor, no page left out of the nav), and the README
stays the short door into it."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_gen", DOCS / "gen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nav_pages(entries: list[object]) -> list[str]:
    pages: list[str] = []
    for entry in entries:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            pages.extend(nav_pages(value) if isinstance(value, list) else [str(value)])
    return pages


def test_the_generated_references_are_what_the_code_says_now() -> None:
    for path, text in gen().outputs().items():
        assert path.is_file(), f"{path.relative_to(ROOT)} is missing: run python docs/gen.py"
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run python docs/gen.py"


def test_the_cli_reference_has_every_command_and_the_repo_reference_every_schema() -> None:
    from reconciler.cli import COMMANDS

    text = (DOCS / "reference" / "cli.md").read_text()
    for name in COMMANDS:
        assert f"\n## reconciler {name}\n" in text, name
    repo = (DOCS / "reference" / "repo-format.md").read_text()
    for key in ("`rollout.waves[].batch`", "`nodes.<name>.pending_release`", "`upgrade[].scope`", "`files[].path`"):
        assert key in repo, key


def test_every_page_is_in_the_nav() -> None:
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert [p for p in pages if p not in nav] == [], "pages no one can reach from the nav"
    assert [p for p in nav if p not in pages] == [], "the nav names pages that do not exist"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        pytest.fail("mkdocs is not installed: pip install -e '.[test]' (mkdocs-material)")
    proc = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"},
                          timeout=300)
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line]
    assert proc.returncode == 0, "\n".join(warnings) or proc.stderr[-3000:]
    assert (tmp_path / "site" / "fleet-guide" / "index.html").is_file()


def test_the_readme_is_a_door_into_the_site() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 80
    assert "\n./demo.sh\n" in readme and "\n./test.sh\n" in readme  # the two commands, as they are typed
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), link
    linked = set(re.findall(r"\]\(docs/([^)#]+)", readme))
    assert {"fleet-guide.md", "install.md", "bootstrap.md", "day2.md", "threat-model.md"} <= linked


def test_one_allowed_signers_path_everywhere() -> None:
    """The settings skeleton's path is the one every page, help text and example uses."""
    skeleton = (ROOT / "contrib" / "agent.yaml").read_text()
    assert "allowed_signers: /etc/reconciler/trust/allowed_signers" in skeleton
    texts = [p.read_text() for p in DOCS.rglob("*.md")] + [(ROOT / "README.md").read_text()]
    texts += [p.read_text() for p in (ROOT / "reconciler" / "cli").glob("*.py")]
    for text in texts:
        assert not re.search(r"/etc/reconciler/(allowed_signers|gnupg|revoked|sealers)\b", text)
