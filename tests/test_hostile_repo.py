"""What a repo author can put in front of a reviewer: a path, a file's lines, a service's files
reach the review comment and `render --out`. Whatever they hold, the reviewer sees all of it,
and `validate` refuses the paths no reviewer should have to read.

The comment is rendered as a forge renders it (markdown-it, CommonMark with raw HTML on).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import Deployment, git
from markdown_it import MarkdownIt

HIDING = "notes\n<!--.txt"  # a newline, then an HTML comment that never closes


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True)


def add_hiding_file(deployment: Deployment) -> None:
    """node-exporter (every node) gains a file whose name opens a comment and whose lines would
    close a three-backtick fence; identity changes too, after it in the comment."""
    deployment.write(f"services/node-exporter/files/{HIDING}", "```\n ```\n</details>\nplain line\n")
    deployment.edit("services/node-exporter/service.yaml", "files:\n",
                    'files:\n  - path: "notes\\n<!--.txt"\n    source: "notes\\n<!--.txt"\n')
    deployment.edit("services/identity/templates/identity.conf.j2", "[", "# shown to the reviewer\n[")


def test_a_path_that_opens_an_html_comment_hides_nothing_from_the_reviewer(deployment: Deployment) -> None:
    before = git("rev-parse", "HEAD", cwd=deployment.work)
    add_hiding_file(deployment)
    after = deployment.commit("a file with a hostile name")
    assert "\n" in git("ls-tree", "-r", "-z", "--name-only", "HEAD", cwd=deployment.work)  # git took it

    proc = cli("diff", "--repo", str(deployment.work), before, after, "-o", "markdown")
    assert proc.returncode == 0, proc.stderr
    rendered = MarkdownIt("commonmark").render(proc.stdout)

    assert "<!--" not in rendered  # no comment opened: nothing after it is hidden
    assert "notes\\n&lt;!--.txt" in rendered  # the name shown, its newline visible
    # Everything after the hostile name is there: identity's section and its diff, whole.
    assert "<summary>identity on " in rendered and "+# shown to the reviewer" in rendered
    # The file's own lines stay inside their fence: "</details>" is text, not a tag.
    assert "+```\n+ ```\n+&lt;/details&gt;\n+plain line" in rendered
    assert rendered.count("<details>") == rendered.count("</details>")
    # The diff header names the path as git quotes it, on one line.
    assert '+++ "b/' in proc.stdout and 'node-exporter/notes\\n<!--.txt"' in proc.stdout


def test_validate_refuses_a_path_with_a_newline_naming_it_escaped(deployment: Deployment) -> None:
    add_hiding_file(deployment)
    deployment.commit("a file with a hostile name")

    for where in ([], ["--rev", "HEAD"]):  # the work tree and the commit alike
        proc = cli("validate", "--repo", str(deployment.work), *where)
        assert proc.returncode == 2, proc.stdout
        lines = proc.stderr.splitlines()
        assert "services/node-exporter/files/notes\\n<!--.txt: a file name with a control character or a " \
               "line break" in proc.stderr, proc.stderr
        assert "services/node-exporter/service.yaml:9: path 'notes\\n<!--.txt' has a control " \
               "character or a line break" in proc.stderr, proc.stderr
        assert len(lines) == 3 and "Traceback" not in proc.stderr


def test_render_out_refuses_a_service_file_named_like_its_own_spec(deployment: Deployment, tmp_path: Path) -> None:
    # render --out writes OUT/<node>/<service>/service.json, the service's runtime spec: a repo
    # file of that name would be silently replaced by it in the tree a reviewer reads.
    deployment.write("services/node-exporter/files/service.json", '{"labels": {"team": "metrics"}}\n')
    deployment.edit("services/node-exporter/service.yaml", "files:\n",
                    "files:\n  - path: service.json\n    source: service.json\n")
    out = tmp_path / "out"

    proc = cli("render", "--repo", str(deployment.work), "--all", "--out", str(out))

    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.strip() == ("error: services/node-exporter/service.yaml:9: render --out: service "
                                   "'node-exporter' has a file 'service.json', the name render --out gives the "
                                   "service's spec: rename the file [BAD_INPUT]"), proc.stderr
    assert not out.exists() or not any(out.iterdir())  # nothing written
    # Without --out there is no clash: the slice renders.
    assert cli("render", "--repo", str(deployment.work), "--all").returncode == 0
