"""Variables that reference variables (issue 39): with the Ansible dialect (or reconciler.yaml
``templates: {variables: templated}``) an inventory value ``b: "{{ a }}"`` is rendered, lazily,
per node, against the node's merged variables, as Ansible does; without it, it is text as before.
Each test runs the real command on a repo in a directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "repo"
ANSIBLE = "templates: {dialect: ansible}\n"


def write(root: Path, inventory: str, template: str, *, settings: str = ANSIBLE, service: str = "",
          **more: str) -> Path:
    files = {"reconciler.yaml": "format: 1\nname: p\n" + settings, "inventory.yaml": inventory,
             "services/s/service.yaml": "runtime: {command: [x]}\nfiles: [{path: out, template: t.j2}]\n" + service,
             "services/s/templates/t.j2": template, **{f"services/s/templates/{k}": v for k, v in more.items()}}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def reconciler(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True)


def render(root: Path) -> tuple[int, str, Path]:
    out = root.parent / "out"
    proc = reconciler("render", "--repo", str(root), "--all", "--out", str(out))
    return proc.returncode, proc.stdout + proc.stderr, out


def test_variables_resolve_per_node_after_merging_across_precedence_levels(tmp_path: Path) -> None:
    inventory = """\
vars:
  url: "http://{{ host }}:{{ port }}"
  port: 80
groups:
  g:
    services: [s]
    vars:
      host: "{{ inventory_hostname }}.{{ domain }}"
      port: 8080
nodes:
  n1: {groups: [g], vars: {domain: a.example}}
  n2: {groups: [g], vars: {domain: b.example, port: 9090}}
"""
    template = "{{ url }} {{ greeting }} peer {{ hostvars['n2'].url }}\n"
    service = "defaults: {greeting: 'hello {{ host }}', domain: unused.example}\n"
    code, output, out = render(write(tmp_path / "repo", inventory, template, service=service))
    assert code == 0, output
    assert (out / "n1/s/out").read_text() == "http://n1.a.example:8080 hello n1.a.example peer http://n2.b.example:9090\n"
    assert (out / "n2/s/out").read_text() == "http://n2.b.example:9090 hello n2.b.example peer http://n2.b.example:9090\n"


def test_a_single_expression_gives_its_native_value(tmp_path: Path) -> None:
    inventory = """\
vars:
  servers: "{{ groups.g }}"
  port: 5
  ports: [1, "{{ port }}"]
  count: "{{ ports | length }}"
  label: "port {{ port }}"
  opts: {debug: "{{ port > 3 }}"}
groups:
  g: {services: [s]}
nodes:
  n1: {groups: [g]}
  n2: {groups: [g]}
"""
    template = ("{{ servers | join(',') }} {{ servers[1] }} {{ ports[1] + 1 }} {{ count + 1 }} "
                "{{ label ~ '!' }} {{ opts.debug is sameas true }}\n")
    code, output, out = render(write(tmp_path / "repo", inventory, template))
    assert code == 0, output
    assert (out / "n1/s/out").read_text() == "n1,n2 n2 6 3 port 5! True\n"


CYCLE = """\
vars:
  a: "{{ b }}"
  b: "{{ a }}"
groups:
  g: {services: [s]}
nodes:
  n1: {groups: [g]}
"""


def test_a_cycle_names_where_it_closes_and_its_chain(tmp_path: Path) -> None:
    root = write(tmp_path / "repo", CYCLE, "line one\n{{ a }}\n")
    for proc in (reconciler("validate", "--repo", str(root)),
                 reconciler("render", "--repo", str(root), "--all", "--out", str(tmp_path / "out"))):
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert ("inventory.yaml:3: node n1, service s: services/s/templates/t.j2:2 -> a (inventory.yaml:2) "
                "-> b (inventory.yaml:3) -> a: the variables refer to each other in a cycle (a -> b -> a)"
                in proc.stderr), proc.stderr
        assert "Traceback" not in proc.stderr


def test_an_undefined_name_names_the_variable_and_the_chain_from_the_template(tmp_path: Path) -> None:
    inventory = """\
vars:
  url: "{{ keystone_url }}/v3"
  keystone_url: "http://{{ kolla_fqdn }}:5000"
groups:
  g:
    services: [s]
nodes:
  n1: {groups: [g]}
"""
    code, output, _ = render(write(tmp_path / "repo", inventory, "a\nb\n{{ url }}\n"))
    assert code == 2
    assert ("inventory.yaml:3: node n1, service s: services/s/templates/t.j2:3 -> url (inventory.yaml:2) "
            "-> keystone_url (inventory.yaml:3) -> undefined 'kolla_fqdn'" in output), output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output
    # From a runtime string: the chain starts at the service.yaml key that read it.
    root = write(tmp_path / "repo2", inventory, "x\n", service="health: {http: '{{ keystone_url }}'}\n")
    proc = reconciler("validate", "--repo", str(root))
    assert proc.returncode == 2
    assert ("inventory.yaml:3: node n1, service s: services/s/service.yaml:3 -> keystone_url (inventory.yaml:3) "
            "-> undefined 'kolla_fqdn'" in proc.stderr), proc.stderr


def test_off_the_values_are_text_as_before(tmp_path: Path) -> None:
    inventory = "vars: {a: 1, b: '{{ a }}'}\ngroups:\n  g: {services: [s]}\nnodes:\n  n1: {groups: [g]}\n"
    for name, settings in (("jinja", ""), ("literal", "templates: {dialect: ansible, variables: literal}\n")):
        code, output, out = render(write(tmp_path / name, inventory, "{{ b }}", settings=settings))
        assert code == 0, output
        assert (out / "n1/s/out").read_text() == "{{ a }}"
    # ... and a Jinja repo may turn them on alone.
    code, output, out = render(write(tmp_path / "on", inventory, "{{ b }}", settings="templates: {variables: templated}\n"))
    assert code == 0, output
    assert (out / "n1/s/out").read_text() == "1"


def test_a_variable_nobody_reads_is_never_rendered(tmp_path: Path) -> None:
    inventory = """\
vars:
  broken: "{{ nope }}"
  loop: "{{ loop }}"
  bad: "{{ 'maybe' | bool }}"
  fine: "{{ broken | default('fallback') }}"
groups:
  g: {services: [s]}
nodes:
  n1: {groups: [g]}
"""
    template = "{{ fine }} {{ broken is defined }}{% if false %}{{ loop }}{{ bad }}{% endif %}"
    code, output, out = render(write(tmp_path / "repo", inventory, template))
    assert code == 0, output
    assert (out / "n1/s/out").read_text() == "fallback False"


def test_a_variable_that_reads_a_secret_keeps_it_out_of_what_is_printed(tmp_path: Path) -> None:
    inventory = f"""\
vars:
  token: "{{{{ secrets.db_password | b64encode }}}}"
groups:
  g: {{services: [s]}}
nodes:
  ctl1:
    groups: [g]
    vars: {{age_recipient: {yaml.safe_load((EXAMPLE / 'inventory.yaml').read_text())['nodes']['ctl1']['vars']['age_recipient']}}}
"""
    service = "  - {path: again, template: t.j2}\n  - {path: plain, template: plain.j2}\n"
    root = write(tmp_path / "repo", inventory, "t={{ token }}\n", **{"plain.j2": "nothing secret\n"})
    (root / "services/s/service.yaml").write_text("runtime: {command: [x]}\nfiles:\n  - {path: out, template: t.j2}\n"
                                                  + service)
    (root / "secrets").mkdir()
    shutil.copy(EXAMPLE / "secrets/controllers.yaml", root / "secrets/controllers.yaml")
    proc = reconciler("render", "--repo", str(root), "--node", "ctl1", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    files = {f["path"]: f for f in json.loads(proc.stdout)[0]["services"][0]["files"]}
    # Both files read the variable (the second from the cache): both are secret files.
    assert files["out"].get("secret") and files["again"].get("secret"), files
    assert not files["plain"].get("secret")
    # A runtime string that reads it is refused, as one reading secrets.db_password is.
    (root / "services/s/service.yaml").write_text("runtime: {command: [x], env: {T: '{{ token }}'}}\n"
                                                  "files:\n  - {path: out, template: t.j2}\n")
    proc = reconciler("render", "--repo", str(root), "--node", "ctl1", "-o", "json")
    assert proc.returncode == 2 and "env uses a secret" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_a_review_sees_a_change_that_reaches_a_template_through_variables(tmp_path: Path) -> None:
    # The diff renders only the services whose inputs changed: a name read through a variable,
    # a default or a peer's variable is one of them.
    inventory = """\
vars: {a: 1}
groups:
  g: {services: [s]}
nodes:
  n1: {groups: [g], vars: {b: "{{ a }}"}}
  n2: {groups: [g], vars: {b: "{{ a }}", c: 0}}
"""
    root = write(tmp_path / "repo", inventory, "{{ greeting }}\n", **{"peer.j2": "{{ hostvars['n2'].b }}\n"})
    (root / "services/s/service.yaml").write_text(
        "runtime: {command: [x]}\nfiles: [{path: out, template: t.j2}, {path: peer, template: peer.j2}]\n"
        "defaults: {greeting: 'hi {{ b }}'}\n")
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "a"], cwd=root,
                   check=True)
    for old, new, changed in (("vars: {a: 1}", "vars: {a: 2}", {"n1": ["out", "peer"], "n2": ["out", "peer"]}),
                              ("c: 0", "a: 5", {"n1": ["peer"], "n2": ["out", "peer"]})):
        (root / "inventory.yaml").write_text(inventory.replace(old, new))
        proc = reconciler("diff", "--repo", str(root), "--local", "-o", "json")
        assert proc.returncode == 0, proc.stderr
        seen = {n["node"]: sorted(f["path"] for f in n["files"]) for n in json.loads(proc.stdout)["nodes"]
                if n["files"]}
        assert seen == changed, proc.stdout
