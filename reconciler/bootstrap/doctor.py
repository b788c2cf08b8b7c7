"""``reconciler check``: a node's settings against what the agent will meet, one line each, with
what to do (as ``flux check`` does). Every check is the agent's own code: the trust root as
``configured_root`` loads it, the age identity as a pass reads it, the remote through
``source.Source`` into a throwaway mirror, the head through the trust ``Gate`` as a new node
judges it, the repo through ``load_repo``. Nothing in the state dir is changed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.core.errors import ReconcilerError

if TYPE_CHECKING:
    from reconciler.repo.definitions import DeploymentRepo
    from reconciler.settings import AgentConfig
    from reconciler.source.mirror import Source

OK, FAIL, SKIP = "ok", "FAIL", "skip"
CLOCK_SLACK = 300  # seconds a node's clock may run behind the head's commit time (NTP keeps far closer)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | FAIL | skip
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass
class _Seen:
    """What the later checks need of the earlier ones (a check that could not run is a skip)."""

    root: Any = None
    identity: tuple[Any, ...] = ()
    note_blob: bytes | None = None
    head: str | None = None
    repo: DeploymentRepo | None = None
    source: Source | None = None
    checks: list[Check] = field(default_factory=list)


def run_checks(cfg: AgentConfig) -> list[Check]:
    """Every check, in order; a failure never stops the ones that do not depend on it."""
    seen = _Seen()
    with tempfile.TemporaryDirectory(prefix="reconciler-check-") as scratch:
        for step, name in ((_trust_root, "trust root"), (_note_key, "note key"), (_age_identity, "age identity"),
                           (_other_files, "local files"), (_remote, "remote"), (_head_trust, "signed head"),
                           (_repo, "inventory"), (_node_listed, "trust/nodes"), (_recipients, "age recipient"),
                           (_drivers, "drivers"), (_state_dir, "state dir"), (_clock, "clock")):
            try:
                seen.checks.extend(step(cfg, seen, Path(scratch)))
            except ReconcilerError:
                raise  # the settings themselves (exit 2), as the command line says them
            except Exception as exc:  # noqa: BLE001 - said as this check's line, the rest still run
                seen.checks.append(_internal(name, exc))
    return seen.checks


def _internal(name: str, exc: Exception) -> Check:
    return Check(name, FAIL, f"internal error in check {name}: {type(exc).__name__}: {exc}",
                 "a bug of reconciler check: report it with this line (the other checks ran)")


@contextmanager
def _said(out: list[Check], name: str, fix: str) -> Iterator[None]:
    """A ``ReconcilerError`` of the block as a FAIL of ``name`` with its one line; any other
    exception as a FAIL of its own, so one check's bug never hides the others' answers."""
    try:
        yield
    except ReconcilerError as exc:
        out.append(Check(name, FAIL, str(exc), fix))
    except Exception as exc:  # noqa: BLE001 - said as this check's line, the rest still run
        out.append(_internal(name, exc))


Step = Callable[["AgentConfig", _Seen, Path], list[Check]]


def _trust_root(cfg: AgentConfig, seen: _Seen, scratch: Path) -> list[Check]:
    from reconciler.node.keeper import configured_root

    out: list[Check] = []
    with _said(out, "trust root", "copy the repo's trust/allowed_signers to the path trust.allowed_signers names"):
        seen.root = configured_root(cfg.trust)
        out.append(Check("trust root", OK, f"{len(seen.root.signers)} signer(s) in {cfg.trust.allowed_signers}"
                         if cfg.trust.allowed_signers else "an OpenPGP keyring"))
    return out


def _note_key(cfg: AgentConfig, seen: _Seen, scratch: Path) -> list[Check]:
    from reconciler.node.report import key_loader

    out: list[Check] = []
    if cfg.note_key is None:
        return [Check("note key", SKIP, "no note_key setting: the agent makes one in the state dir on its first run",
                      "keep one outside the state dir (note_key:), listed in the repo's trust/nodes")]
    with _said(out, "note key", "ssh-keygen -t ed25519 -N '' -f FILE; chmod 600 FILE; note_key: FILE"):
        key = key_loader(cfg.note_key, cfg.state_dir)()
        seen.note_blob = key.blob
        out.append(Check("note key", OK, f"{cfg.note_key} ({key.key_type}, owner-only)"))
    return out


def _age_identity(cfg: AgentConfig, seen: _Seen, scratch: Path) -> list[Check]:
    from reconciler.node.desired import read_identity
    from reconciler.render.secrets import identities

    path = cfg.secrets.age_identity
    if path is None:
        return [Check("age identity", SKIP, "no secrets.age_identity: this node decrypts no secrets",
                      "set secrets.age_identity if its services read secrets")]
    out: list[Check] = []
    with _said(out, "age identity", f"an age key readable by its owner only: chmod 600 {path}"):
        seen.identity = identities(read_identity(path), str(path))
        out.append(Check("age identity", OK, f"{path} opens {seen.identity[0].recipient}"))
    return out


def _other_files(cfg: AgentConfig, seen: _Seen, scratch: Path) -> list[Check]:
    """The rest of what the agent checks at start (registry passwords, host root): ``check_local``."""
    from reconciler.node.localfiles import check_local

    if seen.root is None or (cfg.secrets.age_identity is not None and not seen.identity):
        return []  # check_local would repeat the failure said above
    out: list[Check] = []
    with _said(out, "local files", "fix the file the line names"):
        check_local(cfg)
        out.append(Check("local files", OK, "what the settings name is readable (check_local)"))
    return out


def _remote(cfg: AgentConfig, seen: _Seen, scratch: Path) -> list[Check]:
    from reconciler.source.gitrun import safe_url
    from reconciler.source.mirror import Source

    out: list[Check] = []
    src = Source(cfg.remote, cfg.branch, scratch / "mirror", ssh_command=cfg.ssh_command, progress=False,
                 reads=cfg.read_urls, write=cfg.write_url)
    with _said(out, "remote", "check the URL, the network and the node's git key (ssh_command)"):
        seen.head = src.remote_head()
        src.fetch()  # the repo's checks below need its files, whatever the trust root says
        seen.source = src
        out.append(Check("remote", OK, f"{safe_url(src.url)} answers: {cfg.branch} at {seen.head[:12]}"))
    return out


def _head_trust(cfg: AgentConfig, seen: _Seen, scratch: Path) -> list[Check]:
    from reconciler.trust.root import Policy
    from reconciler.trust.verify import Gate, repo_requires_binding

    if seen.source is None or seen.root is None:
        return [Check("signed head", SKIP, "needs the remote and the trust root")]
    out: list[Check] = []
    with _said(out, "signed head", "sign the branch with a key of the trust root, or update this node's root"):
        head, repo = str(seen.head), seen.source.repo
        gate = Gate(seen.root, Policy(cfg.trust.policy), node_revoked=seen.root.revoked, branch=cfg.branch,
                    require_branch_binding=cfg.trust.require_branch_binding)
        decision = gate.decide(repo, head, None, require_binding=repo_requires_binding(repo, head))
        signer = decision.signer
        who = f" by {signer.principal} ({signer.fingerprint})" if signer else ""
        out.append(Check("signed head", OK, f"{head[:12]} verifies under the trust root{who}"))
    return out


def _repo(cfg: AgentConfig, seen: _Seen, scratch: Path) -> list[Check]:
    from reconciler.repo.load import load_repo
    from reconciler.repo.tree import open_tree

    if seen.source is None or seen.head is None or seen.source.local_head() != seen.head:
        return []
    out: list[Check] = []
    with _said(out, "inventory", "fix the repo (reconciler validate)"):
        repo = load_repo(open_tree(seen.source.path, seen.head))
        if cfg.node not in repo.nodes:
            out.append(Check("inventory", FAIL, f"node {cfg.node} is not in inventory.yaml at {seen.head[:12]}",
                             f"reconciler node add {cfg.node} (in the repo), or fix --node"))
        else:
            seen.repo = repo
            out.append(Check("inventory", OK, f"node {cfg.node} in groups {', '.join(repo.nodes[cfg.node].groups)}"))
    return out


def _node_listed(cfg: AgentConfig, seen: _Seen, scratch: Path) -> list[Check]:
    from reconciler.trust.notesig import parse_nodes
    from reconciler.trust.verify import tree_file

    if seen.repo is None or seen.source is None or seen.head is None or seen.note_blob is None:
        return []
    raw = tree_file(seen.source.repo, seen.head, "trust/nodes") or b""
    out: list[Check] = []
    with _said(out, "trust/nodes", "fix trust/nodes in the repo"):
        signers = parse_nodes(raw.decode(errors="replace"), "trust/nodes")
        listed = any(s.key_blob == seen.note_blob and cfg.node in s.principals for s in signers)
        by_ca = any(s.cert_authority for s in signers)
        if listed or by_ca:
            out.append(Check("trust/nodes", OK, f"lists {cfg.node}'s note key" if listed else
                             "a node CA: this node's certificate must name it"))
        else:
            out.append(Check("trust/nodes", FAIL, f"trust/nodes at {seen.head[:12]} does not list this note key "
                             f"for {cfg.node}: the other nodes will not count its notes",
                             f"reconciler note-key >> trust/nodes in the repo (or reconciler node add {cfg.node}), "
                             "commit"))
    return out


def _recipients(cfg: AgentConfig, seen: _Seen, scratch: Path) -> list[Check]:
    from reconciler.render.secrets import data_key
    from reconciler.repo.sops import recipient_id

    if seen.repo is None or not seen.identity:
        return []
    wanted = seen.repo.nodes[cfg.node].vars.get("age_recipient")
    mine = {k.recipient for k in seen.identity}
    if wanted is None:
        return [Check("age recipient", FAIL, f"inventory.yaml gives {cfg.node} no age_recipient",
                      f"reconciler node add {cfg.node} --age-recipient {sorted(mine)[0]}")]
    if recipient_id(str(wanted)) not in {recipient_id(r) for r in mine}:
        return [Check("age recipient", FAIL, f"the identity opens {sorted(mine)[0][:20]}..., the inventory gives "
                      f"{str(wanted)[:20]}...",
                      "give the node the identity of its age_recipient, or fix the inventory")]
    files = [f for f in seen.repo.secret_files.values() if recipient_id(str(wanted)) in
             {recipient_id(r) for r in f.recipients}]
    unopened = [f.path for f in files if data_key(f, seen.identity) is None]
    if unopened:
        return [Check("age recipient", FAIL, f"{unopened[0]} lists this node but its key does not open it",
                      f"re-encrypt it: sops updatekeys {unopened[0]}")]
    return [Check("age recipient", OK, f"{cfg.node}'s age_recipient; opens {len(files)} secrets file(s)")]


def _drivers(cfg: AgentConfig, seen: _Seen, scratch: Path) -> list[Check]:
    from reconciler.repo.placement import driver_of, services_of

    used: set[str] = set()
    if seen.repo is not None:
        node = seen.repo.nodes[cfg.node]
        for name in services_of(node, seen.repo.groups, frozenset(), True):
            used.add(driver_of(seen.repo.services[name].driver, node, seen.repo.settings))
    out = [Check("driver process", OK, "always available")]
    for name, probe, fix in (("docker", _docker, "start the engine, or set DOCKER_HOST"),
                             ("systemd", lambda: _systemd(cfg), "the systemd driver needs systemd running (PID 1)")):
        problem = probe()
        if problem is None:
            out.append(Check(f"driver {name}", OK, "answers" if name == "docker" else "present"))
        else:
            out.append(Check(f"driver {name}", FAIL if name in used else SKIP,
                             problem + ("" if name in used else " (no service of this node uses it)"), fix))
    return out


def _docker() -> str | None:
    try:
        import docker

        client = docker.from_env(timeout=5)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - any failure to reach the engine is the answer
        return f"the engine does not answer: {str(exc)[:120]}"
    return None


def _systemd(cfg: AgentConfig) -> str | None:
    command = cfg.host.systemctl[0] if cfg.host.systemctl else "systemctl"
    if shutil.which(command) is None:
        return f"{command}: not found"
    if not Path("/run/systemd/system").is_dir():
        return "systemd is not running (no /run/systemd/system)"
    return None


def _state_dir(cfg: AgentConfig, seen: _Seen, scratch: Path) -> list[Check]:
    path = cfg.state_dir
    where = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    if not where.is_dir() or not os.access(where, os.W_OK | os.X_OK):
        return [Check("state dir", FAIL, f"{where} is not writable by this user" if where.is_dir() else
                      f"{where} is not a directory", f"run as the agent's user, or chown {where}")]
    made = "" if where == path else f" (made on the first run, in {where})"
    return [Check("state dir", OK, f"{path} writable{made}")]


def _clock(cfg: AgentConfig, seen: _Seen, scratch: Path) -> list[Check]:
    from reconciler.source.gitrun import commit_time

    now = time.time()
    when = commit_time(seen.source.path, seen.head) if seen.source and seen.head and \
        seen.source.local_head() == seen.head else None
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if when is not None and now < when - CLOCK_SLACK:
        return [Check("clock", FAIL, f"{stamp} is {int(when - now)} s before the head's commit time: key validity "
                      "is judged by this clock", "set the time (NTP: timedatectl set-ntp true)")]
    return [Check("clock", OK, stamp + (" (not before the head's commit time)" if when else ""))]
