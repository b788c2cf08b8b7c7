"""A hostile repo file on the way through ``yamlfast`` and the careful path behind it (a review
of the fast load, issue 40): what the careful path let through, both now refuse alike.

A scalar with an explicit tag its constructor cannot build from the text (``!!bool 1``, an empty
``!!int``) made PyYAML raise a KeyError or IndexError past ``_construct``, which read only
ValueError: a traceback, exit code 1, from ``validate``. A sexagesimal integer (``1:30``, YAML
1.1) is built by multiplying a base by 60 each part: quadratic in its length, so a file of
``1:1:1:...`` within the file-size bound cost hours of CPU, where Python refuses a decimal
integer of more than 4,300 digits at once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pygit2
import pytest
from conftest import git

from reconciler.core import yamlfile
from reconciler.core.errors import BadInput
from reconciler.trust.root import Policy
from reconciler.trust.verify import repo_policy, repo_requires_binding

UNBUILDABLE = ["a: !!bool 1\n", "a: !!int\n", "a: !!int '-'\n", "a: !!float ''\n", "a: !!timestamp x\n",
               "? !!bool x\n: 1\n"]
# 40,004 characters of integer: a decimal one of more than 4,300 digits Python does not read
SEXAGESIMAL_BOMB = "a: 1" + ":1" * 20_000 + "\n"


def loaded(text: str, *, plain: bool, max_nodes: int = 10**6) -> tuple[object, ...]:
    try:
        return ("ok", yamlfile._load(text.encode(), "f.yaml", max_nodes, lines={}, plain=plain))
    except BadInput as exc:
        return ("error", str(exc), exc.line)


@pytest.mark.parametrize("text", UNBUILDABLE)
def test_a_scalar_its_tag_cannot_build_is_refused_at_its_line(text: str) -> None:
    # libyaml's composer for a small file, the counting one for a big one; fast and careful alike
    for max_nodes in (10**6, 4):
        fast, careful = loaded(text, plain=True, max_nodes=max_nodes), loaded(text, plain=False, max_nodes=max_nodes)
        assert fast == careful
        assert fast[0] == "error" and fast[2] == 1, fast
    with pytest.raises(BadInput, match=r"^f.yaml:1: "):
        yamlfile.safe_load_all(text.encode(), "f.yaml")


def test_validate_names_a_bad_tag_in_one_line_with_exit_code_2(tmp_path: Path) -> None:
    files = {"reconciler.yaml": "format: 1\nname: small\nsuspend: !!bool 1\n",
             "inventory.yaml": "groups:\n  web:\n    services: [api]\nnodes:\n  n1:\n    groups: [web]\n",
             "services/api/service.yaml": "runtime:\n  command: [python3, api.py]\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)

    proc = subprocess.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)

    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "reconciler.yaml:3: '1' is not a !!bool"


def test_a_sexagesimal_integer_is_bounded_as_a_decimal_one_is() -> None:
    for plain in (True, False):
        assert loaded(SEXAGESIMAL_BOMB, plain=plain) == ("error", "f.yaml:1: number too large", 1)
        assert loaded("a: 190:20:30\nb: -1:30\n", plain=plain) == ("ok", {"a": 685230, "b": -90})
        short = "a: 1" + ":1" * 2000 + "\n"  # 4,001 characters: read, as 4,000 digits would be
        assert loaded(short, plain=plain)[0] == "ok"
    with pytest.raises(BadInput, match=r"^f.yaml:1: number too large$"):
        yamlfile.safe_load_all(SEXAGESIMAL_BOMB.encode(), "f.yaml")


def test_an_unsigned_commits_reconciler_yaml_cannot_crash_the_gate(tmp_path: Path) -> None:
    # A node reads reconciler.yaml of the fetched commit before it verifies it (does it ask for
    # branch bindings?): whoever can push, without the signing key, writes what is read here.
    git("init", "-q", "-b", "main", cwd=tmp_path)
    (tmp_path / "reconciler.yaml").write_text("format: 1\nname: small\ntrust: {policy: !!bool 1}\n")
    git("add", "-A", cwd=tmp_path)
    git("commit", "-q", "-m", "unsigned", cwd=tmp_path)
    repo, head = pygit2.Repository(str(tmp_path)), git("rev-parse", "HEAD", cwd=tmp_path)

    # a file that does not parse asks for nothing (validation says what is wrong)
    assert repo_requires_binding(repo, head) is False
    assert repo_policy(repo, head) is Policy.HEAD
