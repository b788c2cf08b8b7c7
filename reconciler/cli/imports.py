"""``reconciler import kolla-ansible``: a kolla-ansible deployment turned into a deployment repo.
The work is ``reconciler.importers``'s; here are the options, the words and the exit codes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from reconciler.cli.common import emit_json, out, output_option
from reconciler.core.errors import BadInput

_path = click.Path(path_type=Path)


@click.group("import")
def import_group() -> None:
    """Make a deployment repo from a deployment of another tool."""


@import_group.command("kolla-ansible")
@click.argument("deployment", type=_path)
@click.argument("target", type=_path)
@click.option("--inventory", type=_path, help="The INI inventory [DEPLOYMENT/multinode, else all-in-one].")
@click.option("--kolla", "kolla", type=_path, help="kolla-ansible: its wheel (.whl) or an unpacked tree.")
@click.option("--kolla-version", help="Else: download this kolla-ansible release with pip (pip download --no-deps).")
@click.option("--age-recipient", "recipients", multiple=True, metavar="NODE=age1...",
              help="A node's age recipient (its public key); one for each node. The passwords are encrypted to them.")
@click.option("--operator-recipient", help="The operator's age recipient, added to every secrets file's readers.")
@output_option
def kolla_ansible(deployment: Path, target: Path, inventory: Path | None, kolla: Path | None,
                  kolla_version: str | None, recipients: tuple[str, ...], operator_recipient: str | None,
                  output: str) -> None:
    """Import the kolla-ansible deployment in DEPLOYMENT (its /etc/kolla: globals.yml,
    passwords.yml, config/, and the inventory) into a new repo TARGET: one service per enabled
    kolla container (docker driver), the role templates of the given kolla-ansible release,
    passwords encrypted with sops, and IMPORT.md listing what was not carried over.

    \b
    Example:
      reconciler import kolla-ansible /etc/kolla cloud --kolla-version 22.2.0 \\
          --age-recipient control01=age1... --age-recipient compute01=age1...

    \b
    Exit codes:
      0  made
      1  a tool failed (sops)
      2  bad input (a file missing or malformed, named with its line); nothing written
    """
    from reconciler.importers.kolla_inventory import read_deployment
    from reconciler.importers.kolla_repo import import_kolla
    from reconciler.importers.kolla_source import age_recipient, open_release

    keys: dict[str, str] = {}
    for given in recipients:
        node, eq, key = given.partition("=")
        if not eq:
            raise BadInput(f"--age-recipient {given[:60]!r}: give NODE=age1...")
        keys[node] = age_recipient(key)
    dep = read_deployment(deployment, inventory)
    with tempfile.TemporaryDirectory(prefix="reconciler-kolla-") as work:
        release = open_release(kolla, kolla_version, Path(work))
        done = import_kolla(release, dep, target, keys,
                            age_recipient(operator_recipient) if operator_recipient else None)
    if output == "json":
        emit_json({"directory": str(done.directory), "kolla_ansible": done.version, "nodes": list(done.nodes),
                   "services": list(done.services), "not_carried_over": done.not_carried})
        return
    out.print(f"made {done.directory} from kolla-ansible {done.version}: {len(done.nodes)} nodes, "
              f"{len(done.services)} services", markup=False)
    out.print(f"not carried over: {done.not_carried} items, listed in {done.directory / 'IMPORT.md'}", markup=False)
