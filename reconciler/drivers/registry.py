"""Registry logins for image pulls, and how a pull's error is told without a secret in it.

The agent config names, per registry host, a user and where that user's password is: a file
(root-only, as an age identity is) or an environment variable's name. The password itself is
never in the config, and it is read only when a pull needs it, so a rotated file is used from
the next pull on without a restart. Nothing here talks to an engine: ``docker.py`` pulls.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from reconciler.core.errors import ApplyError
from reconciler.core.redact import without_userinfo

DOCKER_HUB = "docker.io"  # what an image name without a registry host means
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class PullFailed(ApplyError):
    """An image this node needs could not be pulled: the registry refused or did not answer,
    or the login's password could not be read. Nothing was stopped for it."""

    reason = "IMAGE_PULL_FAILED"


@dataclass(frozen=True)
class RegistryLogin:
    """How this node logs in to one registry to pull: a user name, and where its password is."""

    registry: str
    """The registry host as image names spell it (``registry.example.org``, ``127.0.0.1:5000``;
    ``docker.io`` for Docker Hub)."""
    username: str
    password_file: Path | None = None
    """A file holding the password (trailing newline ignored); root-only on the node."""
    password_env: str | None = None
    """The name of an environment variable of the agent holding the password."""

    def password(self) -> str:
        """The password, read now; ``PullFailed`` naming the file or variable (never a value)."""
        if self.password_file is not None:
            try:
                text = self.password_file.read_text().rstrip("\r\n")
            except (OSError, UnicodeDecodeError) as exc:
                why = getattr(exc, "strerror", None) or type(exc).__name__
                raise PullFailed(f"registry {self.registry}: cannot read password_file {self.password_file}: {why}",
                                 reason="REGISTRY_LOGIN") from None
            where = f"password_file {self.password_file}"
        else:
            text = os.environ.get(self.password_env or "", "")
            where = f"password_env {self.password_env}"
        if not text:
            raise PullFailed(f"registry {self.registry}: {where} is empty or unset", reason="REGISTRY_LOGIN")
        return text

    def to_dict(self) -> dict[str, str | None]:
        """What may be shown of it: where the password is, never the password."""
        return {"username": self.username, "password_file": str(self.password_file) if self.password_file else None,
                "password_env": self.password_env}


def registry_of(image: str) -> str:
    """The registry host an image reference pulls from, by docker's rule: the first path
    component when it has a '.' or a ':' or is ``localhost``, else Docker Hub."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB


def split_reference(image: str) -> tuple[str, str]:
    """(repository, tag or digest) as the engine's pull API takes them; ``latest`` when untagged."""
    if "@" in image:
        repository, _, digest = image.partition("@")
        return repository, digest
    repository, colon, tag = image.rpartition(":")
    if not colon or "/" in tag:  # the colon was a registry port's, not a tag's
        return image, "latest"
    return repository, tag


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with credentials in URLs (``https://user:pass@host``) stripped, as Flux does
    in its errors, and any of ``secrets`` replaced: a registry's or an engine's error message
    goes into notes and logs."""
    text = without_userinfo(text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
