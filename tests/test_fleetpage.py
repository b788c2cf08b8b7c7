"""The rollout page `status --fleet --html FILE` writes, opened in a real headless Chromium: what
an operator sees (text, hover titles, computed colours, the author of the commit), that every
state has its own readable colour, and that no value from a note or a commit can become markup.

Waves: canary [ctl1] -> controllers [ctl2, ctl3] one at a time -> computes [cmp*]; every node is
its own in-process agent with its own state dir, sharing only the bare repo (file://).
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import browser
from browser import hex_colour as hex_of
from conftest import Deployment, SigningKey, git
from test_rollout import ROLLOUT

from reconciler.agent import Agent
from reconciler.fleet.status import COLOURS, STEP_COLOURS, CommitInfo, NodeStatus, StepTable, contrast, ink, to_html

READABLE = 4.5  # WCAG AA contrast for normal text

# Every cell of the page as the browser draws it: text, hover title, computed colours.
CELLS = """JSON.stringify({
  waves: [...document.querySelectorAll('table.waves tr')].map(tr => ({
    wave: tr.querySelector('th').textContent,
    nodes: [...tr.querySelectorAll('td')].map(td => ({
      node: td.querySelector('.node').textContent, state: td.querySelector('.state').textContent,
      text: td.innerText, title: td.title,
      background: getComputedStyle(td).backgroundColor, color: getComputedStyle(td).color}))})),
  legend: [...document.querySelectorAll('.legend span')].map(s => ({
    state: s.textContent, background: getComputedStyle(s).backgroundColor, color: getComputedStyle(s).color})),
  steps: [...document.querySelectorAll('table.steps td')].map(td => ({
    status: td.textContent, background: getComputedStyle(td).backgroundColor, color: getComputedStyle(td).color})),
  author: document.querySelector('.commit-info') ? document.querySelector('.commit-info').innerText : null,
  refresh: document.querySelector('meta[http-equiv=refresh]') ?
    document.querySelector('meta[http-equiv=refresh]').content : null,
  scripts: document.scripts.length, title: document.title, body: document.body.innerText})"""


def reconciler(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def drawn(page: Path) -> dict[str, Any]:
    seen: dict[str, Any] = json.loads(browser.evaluate(page, CELLS))
    return seen


def assert_a_png(png: Path) -> None:
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, f"{png}: {len(data)} bytes"


def test_every_state_and_every_step_status_has_its_own_readable_colour() -> None:
    assert len(set(COLOURS.values())) == len(COLOURS), COLOURS
    assert len(set(STEP_COLOURS.values())) == len(STEP_COLOURS), STEP_COLOURS
    for name, colour in [*COLOURS.items(), *STEP_COLOURS.items()]:
        assert contrast(colour, ink(colour)) >= READABLE, (name, colour, ink(colour))


def test_a_stopped_rollout_seen_in_chromium_who_applied_failed_halted_or_waits_and_who_wrote_it(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path
) -> None:
    """ctl1 (the canary) applies the commit, ctl2 fails it (identity's port is broken there
    only), ctl3 halts, the computes have not started: a CI job renders the page from a clone
    and reloads it every 30 s; an operator renders it through a node's agent."""
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + ROLLOUT)
    deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                    'port = {{ "five-thousand" if node == "ctl2" else port_base + ports.identity }}')
    bad = deployment.commit("identity: a port ctl2 cannot use")
    fleet = {n: agents(n, deployment.url) for n in ("ctl1", "ctl2", "ctl3")}
    assert fleet["ctl1"].reconcile_once().exit_code == 0
    assert fleet["ctl2"].reconcile_once().exit_code == 1
    halted = fleet["ctl3"].reconcile_once()
    assert halted.report is not None and halted.report.state == "halted"

    clone = tmp_path / "ci"
    git("clone", "-q", deployment.url, str(clone))
    page = tmp_path / "rollout.html"
    proc = reconciler("status", "--fleet", "--repo", str(clone), "--html", str(page), "--html-refresh", "30")
    assert proc.returncode == 1, proc.stderr  # the rollout is stopped

    seen = drawn(page)
    assert [(w["wave"], [(n["node"], n["state"]) for n in w["nodes"]]) for w in seen["waves"]] == [
        ("canary", [("ctl1", "applied")]), ("controllers", [("ctl2", "failed"), ("ctl3", "halted")]),
        ("computes", [("cmp1", "pending"), ("cmp2", "pending")])]
    cells = {n["node"]: n for w in seen["waves"] for n in w["nodes"]}
    # The failing service and its reason: in the cell's text and on hover.
    assert cells["ctl2"]["title"].startswith("identity: ") and cells["ctl2"]["title"] in cells["ctl2"]["text"]
    assert cells["ctl3"]["title"].startswith(f"halted: ctl2 failed {bad[:12]} (identity)")
    assert cells["ctl3"]["title"] in cells["ctl3"]["text"]
    for node, cell in cells.items():
        background, text = hex_of(cell["background"]), hex_of(cell["color"])
        assert background == COLOURS[cell["state"]], (node, cell)
        assert contrast(background, text) >= READABLE, (node, cell)
    # The legend: every state once, in its own colour, readable.
    assert [s["state"] for s in seen["legend"]] == list(COLOURS)
    assert {s["state"]: hex_of(s["background"]) for s in seen["legend"]} == COLOURS
    assert all(contrast(hex_of(s["background"]), hex_of(s["color"])) >= READABLE for s in seen["legend"])
    # Who wrote the commit, and when it was committed.
    when = git("log", "-1", "--format=%cd", "--date=format:%Y-%m-%d %H:%M:%S %z", bad, cwd=clone)
    assert seen["author"] == f"by Operator <op@example.org>, committed {when}: identity: a port ctl2 cannot use"
    assert seen["refresh"] == "30" and seen["scripts"] == 0
    assert f"commit {bad}: 1 applied, 1 failed, 1 halted, 2 pending" in seen["body"]

    # The DOM as Chromium serialises it after load: the same words, and nothing from outside.
    dump = browser.dump_dom(page)
    assert "<script" not in dump and not re.search(r"\b(src|href)=|url\(", dump)
    dom = html.unescape(dump)
    assert ">Operator <op@example.org></span>" in dom and "<b>ctl2</b> failed: identity: " in dom
    assert f"<b>ctl3</b> halted: ctl2 failed {bad[:12]} (identity)" in dom  # said once
    png = tmp_path / "rollout.png"
    browser.screenshot(page, png)
    assert_a_png(png)

    # Through a node's agent (its own mirror, trust root and state dir): the same author.
    mine = tmp_path / "operator.html"
    (tmp_path / "view").mkdir()  # made for it: only the agent makes a state dir where none is
    proc = reconciler("status", "--fleet", "--node", "ctl1", "--remote", deployment.url, "--state-dir",
                      str(tmp_path / "view"), "--allowed-signers", str(merge_key.allowed_signers),
                      "--html", str(mine))
    assert proc.returncode == 1, proc.stderr
    text = mine.read_text()
    assert "Operator &lt;op@example.org&gt;" in text and f'<span class="time">{when}</span>' in text
    assert 'http-equiv="refresh"' not in text  # off unless asked for


def test_markup_in_a_note_or_a_commit_is_shown_as_text_and_the_upgrade_steps_get_their_colours(
    tmp_path: Path,
) -> None:
    """A node name, a detail, a stage, a step and an author that all carry `<script>`: the page
    has no script, the browser shows the words; the steps table colours every status apart."""
    evil = '<script>document.title="owned"</script>'
    statuses = [
        NodeStatus("ctl1", "canary", "applied", "c" * 40),
        NodeStatus(f"ctl2{evil}", "controllers", "failed", "c" * 40, f"identity: {evil}", stage=f"cp{evil}"),
        NodeStatus("ctl3", "controllers", f"odd{evil}", "c" * 40, "a state this version does not know"),
        NodeStatus("cmp1", f"computes{evil}", "waiting", "c" * 40)]
    steps = StepTable(("node-exporter/stop", "node-exporter/migrate", f"node-exporter/{evil}", "post/announce"), {
        "ctl1": ("done", "done", "skipped", "done"), "ctl2": ("done", "failed", "undone", ""),
        "cmp1": ("started", "waiting", "", "")})
    info = CommitInfo(f"Mallory {evil}", f"m@{evil}", 1_700_000_000, 60, f"fix {evil}")
    page = tmp_path / "evil.html"
    text = to_html(statuses, "c" * 40, f"demo {evil}", steps, info=info)
    page.write_text(text)
    assert "<script" not in text and 'http-equiv="refresh"' not in text

    seen = drawn(page)
    assert seen["scripts"] == 0 and seen["title"] == f"demo {evil}"
    cells = {n["node"]: n for w in seen["waves"] for n in w["nodes"]}
    assert cells[f"ctl2{evil}"]["title"] == f"identity: {evil}"
    assert f"identity: {evil}" in cells[f"ctl2{evil}"]["text"] and f"cp{evil}" in cells[f"ctl2{evil}"]["text"]
    assert [w["wave"] for w in seen["waves"]] == ["canary", "controllers", f"computes{evil}"]
    assert seen["author"] == f"by Mallory {evil} <m@{evil}>, committed 2023-11-14 23:13:20 +0100: fix {evil}"
    unknown = cells["ctl3"]
    assert hex_of(unknown["background"]) not in COLOURS.values()  # not mistaken for a known state
    assert contrast(hex_of(unknown["background"]), hex_of(unknown["color"])) >= READABLE

    by_status: dict[str, set[str]] = {}
    for cell in seen["steps"]:
        by_status.setdefault(cell["status"], set()).add(hex_of(cell["background"]))
        assert contrast(hex_of(cell["background"]), hex_of(cell["color"])) >= READABLE, cell
    assert set(by_status) == {*STEP_COLOURS, ""}
    assert all(len(colours) == 1 for colours in by_status.values()), by_status
    assert {s: c.pop() for s, c in by_status.items() if s} == STEP_COLOURS

    png = tmp_path / "evil.png"
    browser.screenshot(page, png)
    assert_a_png(png)


def test_html_refresh_without_a_page_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = reconciler("status", "--fleet", "--repo", str(tmp_path), "--html-refresh", "30")
    assert proc.returncode == 2
    assert proc.stderr == "error: --html-refresh goes with --html [BAD_INPUT]\n"
