"""The kolla-ansible release an import reads its roles from: a wheel, an unpacked tree, or a
version pip downloads (``pip download kolla-ansible==X --no-deps``) into a temporary directory.

Its role defaults, ``group_vars/all`` and ``site.yml`` are read once here; the rest of the
importer sees a ``KollaRelease``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.core.errors import BadInput
from reconciler.core.yamlfile import safe_load

SHARE = "kolla_ansible-{version}.data/data/share/kolla-ansible"


@dataclass(frozen=True)
class KollaRelease:
    version: str
    ansible: Path  # .../share/kolla-ansible/ansible
    group_vars: dict[str, Any] = field(repr=False)  # group_vars/all, merged in file order
    role_enable: dict[str, str] = field(repr=False)  # role -> the enable_* variable site.yml gates it on
    # role -> the vars its play passes it (site.yml's playbooks: rabbitmq.yml's role_rabbitmq_*)
    play_vars: dict[str, dict[str, Any]] = field(repr=False, default_factory=dict)
    role_order: tuple[str, ...] = ()  # the roles in the order site.yml's plays deploy them

    def role_dir(self, role: str) -> Path:
        return self.ansible / "roles" / role

    def roles(self) -> list[str]:
        return sorted(p.name for p in (self.ansible / "roles").iterdir() if p.is_dir())

    def role_defaults(self, role: str) -> dict[str, Any]:
        path = self.role_dir(role) / "defaults" / "main.yml"
        return _mapping(path) if path.is_file() else {}

    def role_vars(self, role: str) -> dict[str, Any]:
        """``vars/main.yml``: above the inventory in Ansible's precedence (``project_name``)."""
        path = self.role_dir(role) / "vars" / "main.yml"
        return _mapping(path) if path.is_file() else {}

    def templates(self) -> list[Path]:
        """Every role template (``roles/*/templates/**/*.j2``), sorted."""
        return sorted((self.ansible / "roles").glob("*/templates/**/*.j2"))


def age_recipient(text: str) -> str:
    """A node's age recipient given on the command line (bech32 ``age1...``)."""
    if not re.fullmatch(r"age1[02-9ac-hj-np-z]{58}", text.strip()):
        raise BadInput(f"--age-recipient: {text.strip()[:60]!r} is not an age recipient (age1...)")
    return text.strip()


def _mapping(path: Path) -> dict[str, Any]:
    data = safe_load(path.read_bytes(), str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BadInput(f"{path}: not a mapping of variables", file=str(path), line=1)
    return data


def open_release(source: Path | None, version: str | None, workdir: Path) -> KollaRelease:
    """The release at ``source`` (a ``.whl`` or an unpacked tree), or ``version`` downloaded by
    pip into ``workdir``."""
    if source is None:
        if version is None:
            raise BadInput("give the kolla-ansible release: --kolla PATH (a wheel or an unpacked tree) "
                           "or --kolla-version X")
        source = download(version, workdir)
    if source.is_file() and source.suffix == ".whl":
        with zipfile.ZipFile(source) as wheel:
            wheel.extractall(workdir / "kolla")
        source = workdir / "kolla"
    if not source.is_dir():
        raise BadInput(f"--kolla {source}: no such wheel or directory")
    return _read(source)


def download(version: str, workdir: Path) -> Path:
    """``pip download kolla-ansible==VERSION --no-deps``: the wheel's path."""
    into = workdir / "download"
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                           "-d", str(into), f"kolla-ansible=={version}"], capture_output=True, text=True)
    wheels = sorted(into.glob("kolla_ansible-*.whl")) if into.is_dir() else []
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise BadInput(f"--kolla-version {version}: pip download kolla-ansible failed: {last}")
    return wheels[0]


def _read(root: Path) -> KollaRelease:
    """A tree holding ``share/kolla-ansible/ansible`` somewhere (an unpacked wheel), or the
    ``ansible`` dir of a source checkout."""
    candidates = [root / "ansible"] + sorted(root.glob("*.data/data/share/kolla-ansible/ansible"))
    ansible = next((c for c in candidates if (c / "roles").is_dir()), None)
    if ansible is None:
        raise BadInput(f"{root}: not kolla-ansible (no ansible/roles in it)")
    version = "unknown"
    for meta in sorted(root.glob("kolla_ansible-*.dist-info/METADATA")) + sorted(root.glob("PKG-INFO")):
        found = re.search(r"^Version: (\S+)", meta.read_text(errors="replace"), re.M)
        version = found.group(1) if found else version
    merged: dict[str, Any] = {}
    for path in sorted((ansible / "group_vars" / "all").glob("*.yml")) or [ansible / "group_vars" / "all.yml"]:
        if path.is_file():
            merged.update(_mapping(path))
    site = ansible / "site.yml"
    return KollaRelease(version, ansible, merged, _role_enable(site), _play_vars(ansible), _role_order(site))


def _play_vars(ansible: Path) -> dict[str, dict[str, Any]]:
    """The ``vars`` a playbook's ``import_role`` or ``roles:`` entry gives a role (the first
    that gives any: the deploy play's; ``include_role`` of ``tasks_from`` elsewhere is not it)."""
    out: dict[str, dict[str, Any]] = {}
    for book in sorted(ansible.glob("*.yml")):
        for play in safe_load(book.read_bytes(), str(book)) or []:
            entries = [*(play.get("roles") or []), *(play.get("tasks") or [])] if isinstance(play, dict) else []
            for entry in entries:
                if not isinstance(entry, dict) or not isinstance(entry.get("vars"), dict):
                    continue
                ref = entry.get("ansible.builtin.import_role") or entry.get("import_role")
                name = ref.get("name") if isinstance(ref, dict) and "tasks_from" not in ref else entry.get("role")
                if isinstance(name, str) and name not in out and all(v is not None for v in entry["vars"].values()):
                    out[name] = dict(entry["vars"])
    return out


def _role_order(site: Path) -> tuple[str, ...]:
    """The roles in the order ``site.yml`` deploys them: each play's ``roles``, or for a play
    that imports a playbook of its own (mariadb.yml, rabbitmq.yml, nova.yml), its name's role
    ("Apply role mariadb")."""
    out: list[str] = []
    plays = safe_load(site.read_bytes(), str(site)) if site.is_file() else []
    for play in plays or []:
        if not isinstance(play, dict):
            continue
        named = re.fullmatch(r"Apply role (\S+)", str(play.get("name", "")))
        roles = [r.get("role") if isinstance(r, dict) else r for r in play.get("roles") or []]
        if not roles and "import_playbook" in play and named:
            roles = [named.group(1)]
        out += [r for r in roles if isinstance(r, str) and r not in out]
    return tuple(out)


def _role_enable(site: Path) -> dict[str, str]:
    """Which ``enable_*`` variable each role's play in ``site.yml`` runs under (its hosts name
    ``&enable_X_True``, the group kolla's ``group_by`` makes of it); absent: always."""
    out: dict[str, str] = {}
    plays = safe_load(site.read_bytes(), str(site)) if site.is_file() else []
    for play in plays or []:
        if not isinstance(play, dict):
            continue
        hosts = play.get("hosts")
        words = " ".join(hosts) if isinstance(hosts, list) else str(hosts or "")
        gate = re.search(r"enable_(\w+?)_True", words)
        for role in play.get("roles") or []:
            name = role.get("role") if isinstance(role, dict) else role
            if isinstance(name, str) and gate and name not in out:
                out[name] = f"enable_{gate.group(1)}"
    return out
