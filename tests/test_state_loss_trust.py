"""A node that lost its state dir recovers its high-water mark from its own notes, and with it the
commit root that was in force then, never an older one: a key the repo retired stays retired.

History::

    C0 initial (signed by the merge key)
    C1 trust/allowed_signers: the new key only (signed by the merge key: the rotation)
    C2 a change signed by the new key
    --- the node's state dir is lost ---
    C3 a change signed by the retired merge key (leaked, with push rights)
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from conftest import Deployment, SigningKey, git, make_key

from reconciler.agent import Agent
from reconciler.settings import TrustConfig
from reconciler.trust.notesig import NoteKey


def rotate_then_change(deployment: Deployment, merge_key: SigningKey, new_key: SigningKey) -> tuple[str, str]:
    deployment.write("trust/allowed_signers", f'merge@example.org namespaces="git" {new_key.public}\n')
    rotation = deployment.commit("rotate the merge key", key=merge_key)
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    change = deployment.commit("a change under the new key", key=new_key)
    return rotation, change


def test_a_retired_key_is_not_trusted_again_after_the_state_dir_is_lost(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path
) -> None:
    new_key = make_key(tmp_path / "k", "merge-2026")
    node = agents("cmp1", deployment.url)
    assert node.reconcile_once().exit_code == 0
    rotation, change = rotate_then_change(deployment, merge_key, new_key)
    assert node.reconcile_once().exit_code == 0 and node.reconcile_once().commit == change
    assert node.gate.root.origin == f"repo@{rotation}"
    note = deployment.note("cmp1", change)
    assert note is not None and note["root"] == f"repo@{rotation}" and "sig" in note

    node.close()
    shutil.rmtree(node.cfg.state_dir)
    deployment.edit("inventory.yaml", "hypervisor: kvm", "hypervisor: xen")
    leaked = deployment.commit("signed with the retired key", key=merge_key)

    again = agents("cmp1", deployment.url)
    refused = again.reconcile_once()
    assert refused.exit_code == 2 and refused.error is not None and refused.error.reason == "UNTRUSTED_KEY", refused
    assert again.gate.root.origin == f"repo@{rotation}"
    assert again.ledger.verdict(leaked) != "applied"
    assert (deployment.note("cmp1", change) or {}).get("state") == "applied"


def test_a_mark_whose_root_nothing_proves_is_refused_until_the_operator_gives_the_root(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path
) -> None:
    new_key = make_key(tmp_path / "k", "merge-2026")
    node = agents("cmp1", deployment.url)
    assert node.reconcile_once().exit_code == 0
    _, change = rotate_then_change(deployment, merge_key, new_key)
    assert node.reconcile_once().exit_code == 0 and node.reconcile_once().commit == change
    node.close()
    shutil.rmtree(node.cfg.state_dir)

    # the note on the mark as an agent before this change wrote it: no root named (re-signed, so
    # it is still this node's own)
    body = {k: v for k, v in (deployment.note("cmp1", change) or {}).items() if k not in ("root", "sig")}
    sealed = NoteKey.load(node.cfg.note_key or Path()).seal("cmp1", change, body)
    git("--git-dir", str(deployment.bare), "-c", "user.name=cmp1", "-c", "user.email=cmp1@example.org", "notes",
        "--ref=reconciler/cmp1", "add", "-f", "-m", json.dumps(sealed, indent=2), change)
    deployment.edit("inventory.yaml", "hypervisor: kvm", "hypervisor: xen")
    leaked = deployment.commit("signed with the retired key", key=merge_key)

    again = agents("cmp1", deployment.url)
    refused = again.reconcile_once()
    assert refused.error is not None and refused.error.reason == "ROOT_UNPROVEN", refused
    assert "trust.allowed_signers" in str(refused.error) and change[:12] in str(refused.error)
    assert again.ledger.verdict(leaked) != "applied"
    again.close()

    # the operator gives the node the root in force: it goes on, and the retired key stays out
    given = agents("cmp1", deployment.url, trust=TrustConfig(allowed_signers=new_key.allowed_signers))
    judged = given.reconcile_once()
    assert judged.error is not None and judged.error.reason == "UNTRUSTED_KEY", judged


def test_a_note_in_a_nodes_ref_that_it_did_not_sign_moves_no_mark(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    node = agents("cmp1", deployment.url)
    first = node.reconcile_once()
    assert first.exit_code == 0
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    later = deployment.commit("a later change")
    node.close()
    shutil.rmtree(node.cfg.state_dir)
    # the server writes "cmp1 applied C" in cmp1's ref, on a commit the node never applied
    forged = {"format": 1, "node": "cmp1", "commit": later, "state": "failed", "time": "2999-01-01T00:00:00Z",
              "services": {}, "error": "forged"}
    git("--git-dir", str(deployment.bare), "-c", "user.name=x", "-c", "user.email=x@example.org", "notes",
        "--ref=reconciler/cmp1", "add", "-f", "-m", json.dumps(forged), later)
    again = agents("cmp1", deployment.url)
    result = again.reconcile_once()
    # a forged "failed" on the head would make it skip the head as failed here before
    assert result.exit_code == 0 and result.commit == later and again.ledger.verdict(later) == "applied", result
