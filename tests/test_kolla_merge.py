"""A file's ``merge``: kolla-ansible's /etc/kolla/config overrides merged into the rendered files
as kolla merges them (its ``merge_configs`` for INI, ``merge_yaml`` for YAML, ``with_first_found``),
each override rendered per node as a template, missing ones skipped, bad ones refused in one line,
the paths kept in the repo; and the import saying them as ``merge`` entries.

The merges are held to kolla's own action plugins (the peer venv of kolla_peer.py): on generated
INI and YAML inputs, and end to end on a small repo against ansible-playbook running them.
test_kolla_render.py compares kolla's own merged nova.conf, with a global and a per-host override.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_import_kolla import KOLLA_VERSION, _deployment, _import, kolla_wheel  # noqa: F401 - the session's wheel
from test_kolla_render import _git, _lines, _write, reconciler

from reconciler.core.yamlfile import safe_load

HEAD = "format: 1\nname: p\ntemplates: {dialect: ansible}\n"
INVENTORY = ("vars: {port: 5, debug: 'yes'}\ngroups:\n  g: {services: [s]}\nnodes:\n  n1: {groups: [g]}\n"
             "  n2: {groups: [g]}\n")


def _service(files: str) -> str:
    return "runtime: {command: [x]}\nfiles:\n" + files


MERGED = _service("""\
  - {path: 0plain.conf, template: a.conf.j2}  # rendered first, as it is: the merged one is not
  - path: a.conf
    template: a.conf.j2
    merge: {format: ini, from: [kolla-config/global.conf, "kolla-config/{{ inventory_hostname }}/a.conf",
                                kolla-config/missing.conf]}
  - path: b.yml
    template: b.yml.j2
    merge: {format: yaml, from: [kolla-config/b.yml]}
  - path: c.cfg
    template: c.j2
    merge: {first_found: true, from: ["kolla-config/{{ inventory_hostname }}/c.cfg", kolla-config/c.cfg]}
""")
FILES = {
    "reconciler.yaml": HEAD, "inventory.yaml": INVENTORY, "services/s/service.yaml": MERGED,
    # Block tags indented: rendered with lstrip_blocks, as kolla's merge renders, they leave no
    # line that INI would read as the continuation of the value above.
    "services/s/templates/a.conf.j2": "[DEFAULT]\ndebug = false\n# dropped\n  {% if port %}\nport = {{ port }}\n"
                                      "  {% endif %}\n[db]\nconnection = a\n",
    "services/s/templates/b.yml.j2": "a: 1\nb: {c: [1], e: {{ port }}}\n",
    "services/s/templates/c.j2": "template {{ inventory_hostname }}\n",
    "kolla-config/global.conf": "[DEFAULT]\ndebug = {{ debug }}\n",
    "kolla-config/n1/a.conf": "[db]\nconnection = \"{{ inventory_hostname }}\"\n[new]\nk = v\n",
    "kolla-config/b.yml": "b: {d: 2}\n",
    "kolla-config/n1/c.cfg": "override {{ inventory_hostname }}\n",
}


def _render(root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return reconciler("render", "--repo", str(root), "--all", "--out", str(out))


def test_overrides_merge_over_the_template_on_each_node_and_a_missing_one_is_skipped(tmp_path: Path) -> None:
    _write(tmp_path / "repo", FILES)
    done = _render(tmp_path / "repo", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    got = {f"{n}/{f}": (tmp_path / "out" / n / "s" / f).read_text() for n in ("n1", "n2")
           for f in ("a.conf", "b.yml", "c.cfg")}
    assert got["n1/a.conf"] == "[DEFAULT]\ndebug = yes\nport = 5\n\n[db]\nconnection = n1\n\n[new]\nk = v\n\n"
    assert got["n2/a.conf"] == "[DEFAULT]\ndebug = yes\nport = 5\n\n[db]\nconnection = a\n\n"
    assert got["n1/b.yml"] == got["n2/b.yml"] == "a: 1\nb:\n  c:\n  - 1\n  d: 2\n  e: 5\n"
    assert (got["n1/c.cfg"], got["n2/c.cfg"]) == ("override n1\n", "template n2\n")
    plain = (tmp_path / "out" / "n1" / "s" / "0plain.conf").read_text()
    assert plain == "[DEFAULT]\ndebug = false\n# dropped\n  port = 5\n  [db]\nconnection = a\n"


@pytest.mark.parametrize(("override", "text", "said"), [
    # Templated: the line is its rendered text's (the source's line 5 is the rendered text's 4).
    ("kolla-config/global.conf", "[DEFAULT]\ndebug = 1\n  {% if true %}\n\n  stray\n  {% endif %}\n",
     "kolla-config/global.conf: node n1, service s: merged into a.conf: not INI (line 4 of its rendered text): "
     "unexpected continuation line"),
    ("kolla-config/n1/a.conf", "[db\nk = v\n", "kolla-config/n1/a.conf:1: node n1, service s: merged into a.conf: "
     "not INI: invalid section"),
    ("kolla-config/b.yml", "b: [1\n", "kolla-config/b.yml:2: node n1, service s: merged into b.yml: not YAML: "
     "invalid YAML"),
    ("kolla-config/b.yml", "- a list\n", "kolla-config/b.yml: node n1, service s: merged into b.yml: not YAML: "
     "a YAML list, not a mapping"),
    ("kolla-config/global.conf", "{{ undefined_name }}\n", "kolla-config/global.conf:1: node n1: "
     "'undefined_name' is undefined"),
])
def test_a_bad_override_is_one_line_naming_the_file_and_line(tmp_path: Path, override: str, text: str,
                                                             said: str) -> None:
    _write(tmp_path / "repo", {**FILES, override: text})
    done = _render(tmp_path / "repo", tmp_path / "out")
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith(f"error: {said}"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


@pytest.mark.parametrize(("source", "said"), [
    ("../outside.conf", "'../outside.conf' has a '..' part (outside the repo)"),
    ("/etc/passwd", "'/etc/passwd' is absolute"),
    ("kolla-config/./global.conf", "has an empty, '.' or '..' part"),
])
def test_a_merge_path_written_out_of_the_repo_is_refused_at_validate(tmp_path: Path, source: str, said: str) -> None:
    service = _service(f"  - {{path: a.conf, template: a.conf.j2, merge: {{format: ini, from: ['{source}']}}}}\n")
    _write(tmp_path / "repo", {**FILES, "services/s/service.yaml": service})
    done = reconciler("validate", "--repo", str(tmp_path / "repo"))
    assert done.returncode == 2 and said in done.stdout + done.stderr, done.stdout + done.stderr


def test_a_merge_path_that_renders_out_of_the_repo_or_through_a_symlink_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    service = _service("  - {path: a.conf, template: a.conf.j2, merge: {format: ini, "
                       "from: ['kolla-config/{{ up }}/global.conf']}}\n")
    _write(root, {**FILES, "services/s/service.yaml": service,
                  "inventory.yaml": INVENTORY.replace("port: 5", "port: 5, up: '..'")})
    done = _render(root, tmp_path / "out")
    assert done.returncode == 2 and "renders with a '..' part (outside the repo)" in done.stderr, done.stderr
    (tmp_path / "secret.conf").write_text("[DEFAULT]\nstolen = yes\n")
    (root / "kolla-config" / "n2").mkdir()
    (root / "kolla-config" / "n2" / "a.conf").symlink_to(tmp_path / "secret.conf")
    _write(root, {"inventory.yaml": INVENTORY, "services/s/service.yaml": MERGED})
    done = _render(root, tmp_path / "out2")
    assert done.returncode == 2 and "kolla-config/n2/a.conf" in done.stdout + done.stderr
    assert "symlink" in done.stdout + done.stderr and not (tmp_path / "out2").exists()


def test_the_review_shows_the_merged_file_change_on_the_node_it_concerns(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    _write(root, FILES)
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "a")
    (root / "kolla-config" / "n1" / "a.conf").write_text("[db]\nconnection = other\n")
    done = reconciler("diff", "--repo", str(root), "--local", "-o", "json")
    assert done.returncode == 0, done.stderr
    seen = {n["node"]: sorted(f["path"] for f in n["files"]) for n in json.loads(done.stdout)["nodes"] if n["files"]}
    assert seen == {"n1": ["a.conf"]}, done.stdout


def test_the_import_says_kollas_merges_and_lists_only_what_it_cannot(kolla_wheel: Path,  # noqa: F811
                                                                   tmp_path: Path) -> None:
    _deployment(kolla_wheel, tmp_path / "kolla", "all-in-one")
    with (tmp_path / "kolla" / "globals.yml").open("a") as globals_yml:
        globals_yml.write('enable_prometheus: "yes"\n')
    code, said = _import(kolla_wheel, tmp_path / "kolla", tmp_path / "repo", ["localhost"])
    assert code == 0, said
    spec = yaml.safe_load((tmp_path / "repo" / "services" / "nova-compute" / "service.yaml").read_text())
    nova = next(f for f in spec["files"] if f["path"] == "nova.conf")
    assert nova["merge"] == {"format": "ini", "from": [
        "kolla-config/global.conf", "kolla-config/nova.conf", "kolla-config/nova/nova-compute.conf",
        "kolla-config/nova/{{ inventory_hostname }}/nova.conf",
        "kolla-config/nova/{{ inventory_hostname }}/nova-compute.conf"]}
    report = (tmp_path / "repo" / "IMPORT.md").read_text()
    merges = report.split("## Config merges not expressed")[1].split("##")[0]
    assert merges.strip() == "- (none)", merges
    assert "config/nova/nova-compute.conf" not in report  # read by nova-compute's merge: applied
    # prometheus.yml's merge_yaml takes the files an ansible find task found: said, not dropped.
    assert ("prometheus-server: roles/prometheus/tasks/config.yml: 'Copying over prometheus config file': "
            "merge_yaml of sources") in report, report


# -- against kolla's own action plugins, in the peer venv ---------------------------------------

PEER = """\
import io, json, sys, yaml
sys.path.insert(0, sys.argv[1])
from merge_configs import OverrideConfigParser
from merge_yaml import Utils
out = []
for kind, texts, extend in json.load(sys.stdin):
    try:
        if kind == "ini":
            parser = OverrideConfigParser()
            for text in texts:
                parser.parse(io.StringIO(text))
            f = io.StringIO()
            parser.write(f)
            out.append(["ok", f.getvalue()])
        else:
            merged = {}
            for text in texts:
                Utils.update_nested_conf(merged, yaml.safe_load(text) or {}, extend)
            out.append(["ok", yaml.dump(merged, default_flow_style=False)])
    except Exception as exc:
        out.append(["error", type(exc).__name__ + ": " + str(exc)])
print(json.dumps(out))
"""


def _kolla(cases: list[tuple[str, list[str], bool]]) -> list[tuple[str, str]]:
    from kolla_peer import peer_venv

    venv = peer_venv(KOLLA_VERSION)
    plugins = venv / "share" / "kolla-ansible" / "ansible" / "action_plugins"
    done = subprocess.run([str(venv / "bin" / "python"), "-c", PEER, str(plugins)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return [(kind, text) for kind, text in json.loads(done.stdout)]


def _ours(kind: str, texts: list[str], extend: bool) -> tuple[str, str]:
    from reconciler.render.mergefmt import IniMerge, MergeError, yaml_merge

    try:
        if kind == "ini":
            ini = IniMerge()
            for text in texts:
                ini.add(text)
            return "ok", ini.text()
        return "ok", yaml_merge([safe_load(t.encode(), "t") for t in texts], extend)
    except MergeError as exc:
        return "error", str(exc)


INI_LINES = ["[DEFAULT]", "[a]", "[ b ]", "[a b]", "[TEMPORARY_ORPHAN_VARIABLE_SECTION]", "[]", "[x", "k = v", "k=v",
             "k: v", "k = 'q'", 'k = "q"', 'k = "', "k =", "k = ", "= v", "k", "K = v2", "other = 1", "u = ü",
             "a:b = c=d", "x = a:b", "  more", "\tmore", "  # not a comment here", "# c", "; c", "", "   ",
             "k = v   ", "key.with-dots = 1"]


def _ini_file(rng: random.Random) -> str:
    text = "\n".join(rng.choice(INI_LINES) for _ in range(rng.randint(0, 9)))
    return text + rng.choice(["", "\n", "\n\n"])


def _yaml_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 2 or roll < 0.4:
        return rng.choice([1, 0, "x", "é", None, True, "a: b", [1, 2], []])
    if roll < 0.6:
        return [_yaml_value(rng, depth + 1) for _ in range(rng.randint(0, 2))]
    return {rng.choice("abc"): _yaml_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


YAML_RAW = ["", "5", "- 1\n", "null\n", "a: &x [1]\nb: *x\n", "a: &x {c: 1}\nb: *x\n", "a:\n  c: [2]\n",
            "'a': 1\n1: one\n"]


def test_the_ini_and_yaml_merges_are_kollas_own_on_generated_inputs() -> None:
    rng = random.Random(39)
    cases: list[tuple[str, list[str], bool]] = [
        ("ini", [_ini_file(rng) for _ in range(rng.randint(1, 3))], False) for _ in range(300)]
    for _ in range(200):
        texts = [rng.choice(YAML_RAW) if rng.random() < 0.2 else
                 yaml.safe_dump(_yaml_value(rng), default_flow_style=rng.random() < 0.5)
                 for _ in range(rng.randint(1, 3))]
        cases.append(("yaml", texts, rng.random() < 0.5))
    theirs = _kolla(cases)
    differ = [(case, got, want) for case, want in zip(cases, theirs, strict=True)
              if (got := _ours(*case))[0] != want[0] or (got[0] == "ok" and got[1] != want[1])]
    assert not differ, differ[:3]
    assert sum(1 for k, _ in theirs if k == "error") > 20  # refusals were exercised too


def test_merged_files_render_as_kollas_merge_plugins_render_them(tmp_path: Path) -> None:
    """End to end against ansible-playbook running kolla's merge_configs and merge_yaml on the
    same template, overrides and variables (templated overrides, one per host, one missing)."""
    from kolla_peer import peer_venv

    root = tmp_path / "repo"
    files = {**FILES,
             "services/s/templates/b.yml.j2": "a: 1\nb:\n  {% for i in [1, 2] %}\n  k{{ i }}: {{ port + i }}\n"
                                              "  {% endfor %}\n  c: [1]\n",
             "kolla-config/b.yml": "b: {d: '{{ debug }}', c: [3]}\nz: {{ inventory_hostname }}\n"}
    _write(root, files)
    done = _render(root, tmp_path / "ours")
    assert done.returncode == 0, done.stderr
    venv = peer_venv(KOLLA_VERSION)
    share = venv / "share" / "kolla-ansible" / "ansible"
    tasks = []
    for dest, module, template, sources in (
            ("a.conf", "merge_configs", "a.conf.j2", ["global.conf", "{{ inventory_hostname }}/a.conf", "missing.conf"]),
            ("b.yml", "merge_yaml", "b.yml.j2", ["b.yml"])):
        tasks.append({module: {"sources": [f"{root}/services/s/templates/{template}",
                                           *(f"{root}/kolla-config/{s}" for s in sources)],
                               "dest": f"{tmp_path}/peer/{{{{ inventory_hostname }}}}/{dest}"}})
    play = [{"hosts": "all", "gather_facts": False, "vars": {"port": 5, "debug": "yes"},
             "tasks": [{"ansible.builtin.file": {"path": f"{tmp_path}/peer/{{{{ inventory_hostname }}}}",
                                                 "state": "directory"}}, *tasks]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "hosts").write_text("n1\nn2\n")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "t"),
           "ANSIBLE_ACTION_PLUGINS": str(share / "action_plugins"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_PYTHON_INTERPRETER": str(venv / "bin" / "python")}
    ran = subprocess.run([str(venv / "bin" / "ansible-playbook"), "-i", str(tmp_path / "hosts"), "-c", "local",
                          str(tmp_path / "play.yml")], env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout[-3000:]
    for node in ("n1", "n2"):
        for name in ("a.conf", "b.yml"):
            theirs = (tmp_path / "peer" / node / name).read_text()
            assert _lines((tmp_path / "ours" / node / "s" / name).read_text()) == _lines(theirs), (node, name)
    assert "connection = n1" in (tmp_path / "ours" / "n1" / "s" / "a.conf").read_text()


# -- hostile merges: bounded at load and at render, and no override text in an error --------------

def _one_merge(fmt: str, sources: list[str], template: str = "a.conf.j2", path: str = "a.conf") -> str:
    quoted = ", ".join(f"'{s}'" for s in sources)
    return _service(f"  - {{path: {path}, template: {template}, merge: {{format: {fmt}, from: [{quoted}]}}}}\n")


def test_a_merge_path_part_with_many_variables_is_matched_in_linear_time_or_refused(tmp_path: Path) -> None:
    # As a regex, {{ a }}x{{ a }}x...y is .*x.*x...y: against a long name of x it backtracks for
    # hours, at load, before any render budget runs.
    long_name = "kolla-config/" + "x" * 250
    allowed = "x".join(["{{ port }}"] * 4) + "y"
    _write(tmp_path / "ok", {**FILES, long_name: "[DEFAULT]\n",
                             "services/s/service.yaml": _one_merge("ini", [f"kolla-config/{allowed}"])})
    done = subprocess.run([*reconciler_cmd(), "validate", "--repo", str(tmp_path / "ok")], capture_output=True,
                          text=True, timeout=20)
    assert done.returncode == 0, done.stdout + done.stderr
    many = "x".join(["{{ port }}"] * 9) + "y"
    _write(tmp_path / "many", {**FILES, long_name: "[DEFAULT]\n",
                               "services/s/service.yaml": _one_merge("ini", [f"kolla-config/{many}"])})
    done = subprocess.run([*reconciler_cmd(), "validate", "--repo", str(tmp_path / "many")], capture_output=True,
                          text=True, timeout=20)
    assert done.returncode == 2 and "more than 4 templated blocks" in done.stdout + done.stderr, done.stdout


def test_a_templated_part_matches_the_names_its_literal_text_allows() -> None:
    import re

    from reconciler.repo.overrides import part_matches

    rng = random.Random(7)
    for _ in range(3000):
        pieces = ["".join(rng.choice("ab") for _ in range(rng.randint(0, 2))) for _ in range(rng.randint(2, 5))]
        part = "{{ x }}".join(pieces)
        name = "".join(rng.choice("ab") for _ in range(rng.randint(0, 8)))
        assert part_matches(part, name) == bool(re.fullmatch(".*".join(map(re.escape, pieces)), name)), (part, name)
    assert part_matches("{{- x }}.conf", "anything") and not part_matches("a{{ x }}", "b")


def reconciler_cmd() -> list[str]:
    import sys
    return [sys.executable, "-m", "reconciler"]


def test_a_yaml_override_nested_too_deep_is_one_line_naming_it(tmp_path: Path) -> None:
    deep = "x: " + "{a: " * 400 + "1" + "}" * 400 + "\n"
    _write(tmp_path / "repo", {**FILES, "kolla-config/b.yml": deep})
    done = _render(tmp_path / "repo", tmp_path / "out")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-300:]
    assert done.stderr.startswith("error: kolla-config/b.yml: node n1, service s: merged into b.yml: not YAML: "
                                  "nested deeper than 100 levels"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_merge_reads_at_most_sixteen_sources_and_each_file_once(tmp_path: Path) -> None:
    _write(tmp_path / "repo", {**FILES, "services/s/service.yaml": _one_merge("ini", ["kolla-config/global.conf"] * 17)})
    done = reconciler("validate", "--repo", str(tmp_path / "repo"))
    assert done.returncode == 2 and "files/0/merge/from: " in done.stderr and "is too long" in done.stderr, done.stderr
    # Sixteen sources that all match every file of a directory, in several entries: each file
    # is read once, not once per source and entry.
    sources = ", ".join(["'d/{{ port }}'"] * 16)
    entries = "".join(f"  - {{path: a{j}.conf, template: a.conf.j2, merge: {{format: ini, from: [{sources}]}}}}\n"
                      for j in range(40))
    bulky = {f"d/f{i}": "[DEFAULT]\n" + "k = v\n" * 2000 for i in range(150)}
    _write(tmp_path / "wide", {**FILES, **bulky, "services/s/service.yaml": _service(entries)})
    import time

    from reconciler.repo.load import load_repo
    from reconciler.repo.tree import DirTree

    started = time.monotonic()
    repo = load_repo(DirTree(tmp_path / "wide"))  # read once each: 0.05 s; once per source and entry: 6 s
    assert time.monotonic() - started < 2 and "d/f149" in repo.services["s"].templates


def test_a_bad_override_line_is_named_not_quoted(tmp_path: Path) -> None:
    # The line may hold a password: quoting its start cuts the password, and a cut password is
    # one the node's redactor no longer recognises.
    secret = "Zq8vN3kP0wR7tY2uL5sA9dF4gH1jK6mX"
    for n, text in enumerate([f"[db]\nmemcache_secret_key_and_the_admin_password_are {secret}\n",
                              f"[db]\n  {secret}\n", f"[DEFAULT]\n[db {secret}\n", f"[db]\n= {secret}\n"]):
        _write(tmp_path / f"r{n}", {**FILES, "kolla-config/global.conf": text})
        done = _render(tmp_path / f"r{n}", tmp_path / f"out{n}")
        assert done.returncode == 2 and "kolla-config/global.conf:2" in done.stderr, done.stderr
        assert secret[:6] not in done.stderr, done.stderr


TAGGED = ["o: !!omap [a: 1, b: 2]\n", "p: !!pairs [a: 1, a: 2]\n", "s: !!set {a, b}\n",
          "b: !!binary aGVsbG8=\n", "t: 2001-12-14t21:59:43.10-05:00\n"]


def test_yaml_tags_merge_as_kolla_dumps_them() -> None:
    cases = [("yaml", [t], False) for t in TAGGED] + [("yaml", ["x: 1\n", t], True) for t in TAGGED]
    theirs = _kolla(cases)
    assert [_ours(*c) for c in cases] == theirs


def test_a_keystone_rotation_interval_over_a_week_is_a_render_error_as_in_kolla() -> None:
    import importlib.util

    from kolla_peer import peer_venv

    from reconciler.core.errors import RenderError
    from reconciler.importers.kolla_tasks import TASK_RESULTS
    from reconciler.render.environment import service_environment

    gen = (peer_venv(KOLLA_VERSION) / "share" / "kolla-ansible" / "ansible" / "roles" / "keystone" / "files"
           / "fernet_rotate_cron_generator.py")
    spec = importlib.util.spec_from_file_location("kolla_fernet_cron", gen)
    assert spec is not None and spec.loader is not None
    kolla = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kolla)
    env = service_environment({"t": TASK_RESULTS["keystone"]["fernet_cron_jobs_json"]}, "s", "ansible")
    for secs in (3600, 86400, 604800, 604860, 700000, 2 * 604800):
        for hosts in (1, 3):
            names = [f"h{i}" for i in range(hosts)]
            try:
                theirs: Any = kolla.generate(hosts - 1, hosts, secs // 60)
            except kolla.RotationIntervalTooLong:
                theirs = "too long"
            try:
                ours: Any = json.loads(env.get_template("t").render(
                    fernet_key_rotation_interval=secs, groups={"keystone": names}, inventory_hostname=names[-1]))
            except RenderError as exc:
                assert "fernet_key_rotation_interval" in str(exc)
                ours = "too long"
            assert ours == theirs, (secs, hosts)
