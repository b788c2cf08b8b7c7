"""Who a process service runs as, and how its programs are started as that user.

The ``user`` and ``group`` service.yaml names are resolved on the node (names or numeric ids);
a program starts as them with no supplementary groups, and its data dir is given to them.
Where systemd runs (and the agent is root), each service starts in a transient scope of its own
(``systemd-run --scope``, in ``reconciler.slice``), ``setpriv`` switching to its user once the
scope is made (which takes root): the words before its command are ``scope_words``.
"""

from __future__ import annotations

import functools
import grp
import os
import pwd
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.drivers.base import clean_env


@dataclass(frozen=True)
class Account:
    """Who a service runs as; None keeps the agent's own uid or gid."""

    uid: int | None
    gid: int | None
    name: str
    home: str

    @property
    def switched(self) -> bool:
        return self.uid is not None or self.gid is not None


def account(user: str, group: str) -> Account:
    """Resolve ``user`` and ``group`` (names, or numeric ids) on this node. No group: the user's
    own. ``LookupError`` says which name the node does not know."""
    pw: pwd.struct_passwd | None = None
    uid: int | None = None
    if user:
        try:
            pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        except KeyError:
            if not user.isdigit():  # a bare uid with no name is usable, as in a container
                raise LookupError(f"no user {user!r} on this node") from None
        uid = pw.pw_uid if pw else int(user)
    gid = pw.pw_gid if pw else None
    if group:
        try:
            gid = grp.getgrgid(int(group)).gr_gid if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            if not group.isdigit():
                raise LookupError(f"no group {group!r} on this node") from None
            gid = int(group)
    if not user:
        env = clean_env()
        return Account(uid, gid, env["USER"], env["HOME"])
    return Account(uid, gid, pw.pw_name if pw else user, pw.pw_dir if pw else "/")


def account_of(rec: dict[str, Any]) -> Account:
    return account(str(rec.get("user", "")), str(rec.get("group", "")))


def as_kwargs(acct: Account) -> dict[str, Any]:
    """subprocess arguments that start a process as the account, with no supplementary groups."""
    if not acct.switched:
        return {}
    return {"user": acct.uid, "group": acct.gid, "extra_groups": []}


def own(path: Path, acct: Account) -> None:
    """Give a data dir to the service's user; all of it when it belonged to another one before."""
    uid = -1 if acct.uid is None else acct.uid
    gid = -1 if acct.gid is None else acct.gid
    st = path.stat()
    if (uid in (-1, st.st_uid)) and (gid in (-1, st.st_gid)):
        return
    for sub in [path, *path.rglob("*")]:
        os.lchown(sub, uid, gid)


@functools.cache  # asked by every driver made (each pass, each supervisor tick): the answer stays
def systemd_scopes() -> bool:
    """Whether services can get scopes of their own: systemd is the init system (sd_booted's
    test), the agent is root, and systemd-run and setpriv are there."""
    return (os.geteuid() == 0 and os.path.isdir("/run/systemd/system")
            and shutil.which("systemd-run") is not None and shutil.which("setpriv") is not None)


def scope_words(name: str, node: str, acct: Account) -> list[str]:
    """The words before a service's command that start it in a scope of its own, as its user.
    A fresh scope name each time: the one of a stopped process may not be gone yet."""
    import secrets  # here: it imports hmac, and with it OpenSSL (3.5 MB of an idle daemon's RSS, issue 40)

    unit = f"reconciler-{name}-{secrets.token_hex(4)}.scope"
    words = [shutil.which("systemd-run") or "systemd-run", "--scope", "--quiet", "--collect",
             f"--unit={unit}", "--slice=reconciler.slice", f"--description=reconciler {node}: {name}", "--"]
    if acct.switched:
        words += [shutil.which("setpriv") or "setpriv",
                  *([f"--reuid={acct.uid}"] if acct.uid is not None else []),
                  *([f"--regid={acct.gid}"] if acct.gid is not None else []), "--clear-groups", "--"]
    # systemd-run adds the scope's INVOCATION_ID; the service's environment stays the clean one.
    return [*words, shutil.which("env") or "env", "-u", "INVOCATION_ID", "--"]
