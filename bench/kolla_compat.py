"""How many of the pinned kolla-ansible release's role templates render, and why each other
one does not (the first error's kind): the harness of issue 39's compatibility benchmark.

    .venv/bin/python bench/kolla_compat.py [--kolla WHEEL_OR_DIR | --kolla-version 22.2.0]

Variables: kolla's role defaults and group_vars/all with an all-in-one globals.yml over them,
as ``reconciler import kolla-ansible`` carries them. The renderer today: plain Jinja2 with
StrictUndefined and the import-time ``bool``/``ternary`` (the repo's Ansible dialect and
templated variables are not wired in yet: that is the next step, and the figure will move).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.importers.kolla_resolve import to_bool  # noqa: E402
from reconciler.importers.kolla_source import open_release  # noqa: E402

GLOBALS = {"kolla_internal_vip_address": "10.10.10.254", "network_interface": "eth0",
           "neutron_external_interface": "eth1", "kolla_base_distro": "rocky"}


def kind(exc: Exception) -> str:
    text = str(exc)
    for pattern, label in ((r"No filter named '([\w.]+)'", "filter {}"), (r"No test named '([\w.]+)'", "test {}"),
                           (r"'([\w]+)' is undefined", "undefined {}")):
        found = re.search(pattern, text)
        if found:
            return label.format(found.group(1))
    return type(exc).__name__


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kolla", type=Path)
    parser.add_argument("--kolla-version", default=None)
    args = parser.parse_args()
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    with tempfile.TemporaryDirectory() as work:
        release = open_release(args.kolla, args.kolla_version or (None if args.kolla else "22.2.0"), Path(work))
        variables: dict[str, object] = {}
        for role in release.roles():
            for key, value in release.role_defaults(role).items():
                variables.setdefault(key, value)
        variables.update(release.group_vars)
        variables.update(GLOBALS)
        variables.update(inventory_hostname="localhost", groups={}, hostvars={})
        failures: Counter[str] = Counter()
        rendered = 0
        templates = release.templates()
        for path in templates:
            env = Environment(loader=FileSystemLoader(str(path.parent)), undefined=StrictUndefined,
                              extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])
            env.filters.update(bool=to_bool)
            try:
                env.get_template(path.name).render(variables)
                rendered += 1
            except Exception as exc:  # noqa: BLE001 - every failure is counted by kind
                failures[kind(exc)] += 1
        print(f"kolla-ansible {release.version}: {rendered} of {len(templates)} role templates render "
              f"({100 * rendered / max(len(templates), 1):.0f} %)")
        for label, count in failures.most_common():
            print(f"  {count:4d}  {label}")


if __name__ == "__main__":
    main()
