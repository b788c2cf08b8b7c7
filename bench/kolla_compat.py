"""How many of the pinned kolla-ansible release's role templates render through the output of
``reconciler import kolla-ansible`` with this project's renderer, and why each other one does not
(the first error's kind; for a variable that only a kolla task sets, that variable).

    .venv/bin/python bench/kolla_compat.py [--kolla WHEEL_OR_DIR | --kolla-version 22.2.0] [-v]

The deployment: kolla's all-in-one inventory with the node's address and facts stand-ins
(``eth0_address``, ``ansible_facts``: docs/ansible-dialect.md), a globals.yml of a small cloud,
passwords.yml filled. It is imported as a user would import it; then each role template is one
service of the node (its role's templates beside it, its role's ``vars/main.yml`` and play vars as
its defaults, as the import gives a kolla service) and rendered with ``render_service``. The
figure that counts (issue 39): the templates that need no variable set by a task.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

from reconciler.importers.kolla_inventory import read_deployment  # noqa: E402
from reconciler.importers.kolla_repo import import_kolla  # noqa: E402
from reconciler.importers.kolla_source import KollaRelease, open_release  # noqa: E402

GLOBALS = """\
kolla_base_distro: "rocky"
kolla_internal_vip_address: "10.10.10.254"
network_interface: "eth0"
neutron_external_interface: "eth1"
"""
STAND_INS = ("eth0_address=10.10.10.11 eth1_address=10.10.20.11 ansible_facts=\"{'processor_vcpus': 4, "
             "'hostname': 'localhost', 'nodename': 'localhost', 'architecture': 'x86_64', 'fqdn': 'localhost', "
             "'os_family': 'RedHat', 'distribution': 'Rocky', 'distribution_major_version': '10', "
             "'memtotal_mb': 8192}\"")


def deployment(release: KollaRelease, where: Path) -> Path:
    share = release.ansible.parent
    where.mkdir()
    lines = []
    for line in (share / "ansible" / "inventory" / "all-in-one").read_text().splitlines():
        lines.append(f"{line} {STAND_INS}" if line.startswith("localhost") else line)
    (where / "all-in-one").write_text("\n".join(lines) + "\n")
    (where / "globals.yml").write_text(GLOBALS)
    filled = []
    example = (share / "etc_examples" / "kolla" / "passwords.yml").read_text().splitlines()
    for i, line in enumerate(example):
        found = re.match(r"^(\s*)([a-z0-9_]+):\s*$", line)
        following = example[i + 1] if i + 1 < len(example) else ""
        if found and not following.startswith(found.group(1) + "  "):
            line = f"{line.rstrip()} pw-{i:05d}-bench"
        filled.append(line)
    (where / "passwords.yml").write_text("\n".join(filled) + "\n")
    return where


def task_set_names(release: KollaRelease) -> set[str]:
    """What kolla's tasks set: a task's ``vars:``, ``set_fact``, ``register``, a loop's item."""
    names = {"item"}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("vars",):
                if isinstance(node.get(key), dict):
                    names.update(node[key])
            for key in ("set_fact", "ansible.builtin.set_fact"):
                if isinstance(node.get(key), dict):
                    names.update(node[key])
            if isinstance(node.get("register"), str):
                names.add(node["register"])
            loop = node.get("loop_control")
            if isinstance(loop, dict) and isinstance(loop.get("loop_var"), str):
                names.add(loop["loop_var"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in [*release.ansible.glob("roles/*/tasks/*.yml"), *release.ansible.glob("*.yml")]:
        try:
            walk(yaml.safe_load(path.read_text()))
        except yaml.YAMLError:
            continue
    return names


def kind(text: str, task_set: set[str], known: set[str]) -> str:
    for pattern, label in ((r"No filter named '([\w.]+)'", "filter {}"), (r"No test named '([\w.]+)'", "test {}"),
                           (r"undefined '([\w]+)'", "undefined {}"), (r"'([\w]+)' is undefined", "undefined {}"),
                           (r"has no attribute '([\w]+)'", "no attribute {}")):
        found = re.search(pattern, text)
        if found:
            name = found.group(1)
            if label == "undefined {}" and name in task_set and name not in known:
                return f"task-set variable {name}"
            return label.format(name)
    return re.sub(r"^.*?: ", "", text.splitlines()[0])[:80]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kolla", type=Path)
    parser.add_argument("--kolla-version", default=None)
    parser.add_argument("-v", "--verbose", action="store_true", help="list each template that does not render")
    args = parser.parse_args()
    import pyrage

    from reconciler.render.node import render_service
    from reconciler.repo.load import load_repo
    from reconciler.repo.tree import DirTree

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        release = open_release(args.kolla, args.kolla_version or (None if args.kolla else "22.2.0"), work / "dl")
        dep = read_deployment(deployment(release, work / "kolla"))
        repo_dir = work / "repo"
        import_kolla(release, dep, repo_dir, {"localhost": str(pyrage.x25519.Identity.generate().to_public())}, None)
        inventory = yaml.safe_load((repo_dir / "inventory.yaml").read_text())
        known = set(inventory["vars"])
        templates = release.templates()
        bench: dict[str, Path] = {}
        for i, path in enumerate(templates):
            role = path.relative_to(release.ansible / "roles").parts[0]
            own = release.role_dir(role) / "templates"
            name = f"kolla-bench-{i:03d}"
            bench[name] = path
            shutil.copytree(own, repo_dir / "services" / name / "templates")
            defaults = {**release.role_vars(role), **release.play_vars.get(role, {}), "project_name": role}
            spec = {"runtime": {"command": ["x"]}, "driver": "process",
                    "files": [{"path": "out", "template": str(path.relative_to(own))}], "defaults": defaults}
            (repo_dir / "services" / name / "service.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        inventory["groups"]["kolla-bench"] = {"services": list(bench)}
        inventory["nodes"]["localhost"]["groups"].append("kolla-bench")
        (repo_dir / "inventory.yaml").write_text(yaml.safe_dump(inventory, sort_keys=False))
        repo = load_repo(DirTree(repo_dir))
        task_set = task_set_names(release)
        failures: Counter[str] = Counter()
        why: dict[str, str] = {}
        for name in bench:
            try:
                render_service(repo, "localhost", repo.services[name])
            except Exception as exc:  # noqa: BLE001 - every failure is counted by its kind
                why[name] = kind(str(exc), task_set, known)
                failures[why[name]] += 1
        rendered = len(bench) - len(why)
        need_task = sum(1 for w in why.values() if w.startswith("task-set variable"))
        free = len(bench) - need_task
        print(f"kolla-ansible {release.version}: {rendered} of {len(bench)} role templates render "
              f"({100 * rendered / max(len(bench), 1):.1f} %); of the {free} that need no variable set by a task, "
              f"{rendered} ({100 * rendered / max(free, 1):.1f} %)")
        for label, count in failures.most_common():
            print(f"  {count:4d}  {label}")
        if args.verbose:
            for name, label in sorted(why.items(), key=lambda kv: str(bench[kv[0]])):
                print(f"  {bench[name].relative_to(release.ansible)}: {label}")


if __name__ == "__main__":
    main()
