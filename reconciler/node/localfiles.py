"""The files a node's own settings name on this machine, checked before the agent does anything.

A missing or unreadable one is this node's settings at fault, not the commit's: said at start, in
one line, exit 2, with nothing fetched, no state dir made and nothing noted. Found only when a
pass needs it (the age identity when a commit has secrets, a registry password at a pull), it
was noted on the commit as the commit's error, with this machine's path in it, and the fleet's
view stopped on it for every node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.core.errors import BadInput, ConfigError, ReconcilerError
from reconciler.node.desired import read_identity
from reconciler.node.keeper import configured_root

if TYPE_CHECKING:
    from pathlib import Path

    from reconciler.settings import AgentConfig


def check_local(cfg: AgentConfig) -> None:
    """A ``BadInput`` (exit 2) for the first local file the settings name that cannot serve: the
    trust root (allowed signers, revoked, sealers, the OpenPGP home), the age identity
    (``SECRET_UNREADABLE``, as a pass would say it), the registry password files, the host root.
    The note key is checked where it is loaded (``report.key_loader``), before the state dir too."""
    configured_root(cfg.trust)
    if cfg.secrets.age_identity is not None:
        _age_identity(cfg.secrets.age_identity)
    for login in cfg.docker.registries:
        if login.password_file is not None:
            try:
                login.password()
            except ReconcilerError as exc:
                raise ConfigError(f"docker.registries: {exc}") from None
    if not cfg.host.root.is_dir():
        raise ConfigError("host.root: not a directory", file=str(cfg.host.root))


def _age_identity(path: Path) -> None:
    """Read and parsed as a pass would (``render.secrets.identities``, the one parser): a key
    with a passphrase, of a type age cannot use or malformed is refused here, in one line that
    never shows it, rather than noted on the commit by the first pass that needs it."""
    from reconciler.render.secrets import SecretUnreadable, identities  # pyrage: only where a key is set

    text = read_identity(path)  # readable, by its owner only: else SECRET_UNREADABLE (exit 2) naming it
    try:
        identities(text, str(path))
    except SecretUnreadable:
        raise
    except BadInput as exc:
        raise SecretUnreadable(str(exc)) from None
