"""The agent's own settings, as frozen dataclasses: who the node is, where it pulls from, who it
trusts, and how it reaches its host, metrics, notifications, secrets and registries.

These never come from the deployment repo: the node decides where it pulls from and who it is.
Reading them from a file (``--config``) and flags, with clear errors, is ``settings.load``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from reconciler.drivers.hostaccess import HostAccess
from reconciler.drivers.registry import RegistryLogin

POLICIES = ("every-commit", "first-parent", "head")


@dataclass(frozen=True)
class TrustConfig:
    """The node's trust root: provisioned on the node, never read from the branch it protects."""

    allowed_signers: Path | None = None
    """SSH allowed signers file, git's format (principals, namespaces, valid-after/before, cert-authority)."""
    gpg_home: Path | None = None
    """GNUPGHOME holding the OpenPGP public keys this node trusts."""
    revoked: Path | None = None
    """Revoked keys, one per line: SHA256:... or an SSH public key, hex for OpenPGP."""
    policy: str = "every-commit"
    """every-commit | first-parent | head. The repo may make it stricter, never looser."""
    sealers: Path | None = None
    """Who may seal unsigned commits (``Reconciler-Seal:`` trailer): SSH principals or key
    fingerprints, one per line."""
    require_branch_binding: bool = False
    """Apply only heads whose message names this node's branch (``Reconciler-Branch:`` trailer).
    The repo may require it too."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: str(v) if isinstance(v := getattr(self, f.name), Path) else v for f in fields(self)}


@dataclass(frozen=True)
class HostConfig:
    """How the agent reaches the node's own OS (systemd units, host files, reboot)."""

    root: Path = Path("/")
    """Where host files are written (``/``; a chroot or a test root otherwise)."""
    systemctl: tuple[str, ...] = ("systemctl",)
    """The systemctl command (argv)."""
    exec: tuple[str, ...] = ()
    """Prefix to run commands where the units run (empty: on this machine)."""
    reboot_command: str = "systemctl reboot"
    boot_id_file: Path = Path("/proc/sys/kernel/random/boot_id")
    """Tells a reboot happened: its content changes at every boot."""

    def access(self) -> HostAccess:
        """What the drivers and upgrade steps reach the host through."""
        return HostAccess(self.root, self.systemctl, self.exec, self.reboot_command, self.boot_id_file)


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus metrics: served over HTTP, written as a node_exporter textfile, or both."""

    listen: str | None = None
    """``host:port`` the daemon serves ``/metrics`` on (``127.0.0.1:9469``); none: not served."""
    textfile: Path | None = None
    """A ``.prom`` file written (atomically) after every pass, for node_exporter's textfile collector."""
    allow_non_loopback: bool = False
    """Serve on an address other than loopback. Off by default: the metrics name commits and
    services, and the exporter has no authentication of its own."""


@dataclass(frozen=True)
class ReceiverConfig:
    """The daemon's webhook receiver: a git server's hook or a forge POSTs, the daemon polls now."""

    listen: str | None = None
    """``host:port`` it answers on (``127.0.0.1:9102``); none: no receiver."""
    secret_file: Path | None = None
    """The file holding the shared HMAC secret (a call without its signature gets 401)."""


@dataclass(frozen=True)
class WebhookConfig:
    url: str
    """Where events are POSTed (JSON body)."""
    secret_env: str | None = None
    """Name of the environment variable that holds the HMAC secret (never the secret itself)."""
    tries: int = 3
    """Attempts per event, the first included."""
    retry_delay: float = 1.0
    """Seconds before the second try; doubled before each next one."""
    timeout: float = 5.0
    """Seconds one try may take."""


@dataclass(frozen=True)
class NotifyConfig:
    """Who is told about events that need a person (refused, failed, halted, applied, drift)."""

    webhook: WebhookConfig | None = None
    apprise: tuple[str, ...] = ()
    """Apprise URLs (``mailto://...``, ``slack://...``): chat and mail targets."""

    @property
    def enabled(self) -> bool:
        return self.webhook is not None or bool(self.apprise)


@dataclass(frozen=True)
class SecretsConfig:
    """How this node reads the repo's SOPS files (``secrets/*.yaml``)."""

    age_identity: Path | None = None
    """The node's age identity file (AGE-SECRET-KEY-1..., root-only); none: templates that use
    ``secrets`` fail to render (SECRET_UNREADABLE)."""


ROLES = ("read", "write", "both")


@dataclass(frozen=True)
class RemoteConfig:
    """One place the deployment repo is: a read mirror, the primary the notes are pushed to, or
    a git bundle carried to an air-gapped site (a ``.bundle`` file's path, read only)."""

    url: str
    role: str = "both"
    """read: polled and fetched from, other nodes' notes read from; write: this node's notes
    pushed to; both."""
    probe: str | None = None
    """http(s) URL of the remote's tips file (``contrib/post-receive-tips``): a poll that finds
    the node's own head there asks git nothing. A hint only; see ``reconciler.probe``."""
    check_every: float = 300.0
    """With a probe: seconds between real git ref checks, whatever the probe says (how long a
    stale probe can hide a new commit)."""

    @property
    def reads(self) -> bool:
        return self.role in ("read", "both")

    @property
    def writes(self) -> bool:
        return self.role in ("write", "both")


@dataclass(frozen=True)
class DockerConfig:
    """The docker driver's settings on this node."""

    registries: tuple[RegistryLogin, ...] = ()
    """Logins for the registries images are pulled from, one per host; the password is named
    (``password_file`` or ``password_env``), never written in the config."""


@dataclass(frozen=True)
class AgentConfig:
    node: str
    """This node's name, as in inventory.yaml."""
    remote: str
    """URL of the deployment repo: file://, git://, ssh://, https:// or a local path. With
    ``remotes``, the write remote (or the first read one when none writes)."""
    branch: str = "main"
    """Branch the node follows."""
    state_dir: Path = Path("/var/lib/reconciler")
    """Local state: mirror, rendered files, SQLite, lock."""
    interval: float = 60.0
    """Seconds between polls of the remote (agent daemon)."""
    jitter: float = 10.0
    """Random extra delay per poll, plus a fixed per-node offset, so a fleet does not poll in step."""
    supervise_interval: float = 2.0
    """Seconds between liveness checks of the services (agent daemon)."""
    wait_poll: float = 1.0
    """Seconds between wait-polls while a pass waits for the rollout's batch before (agent
    daemon): a look at the notes tips of the few nodes it waits on (the probe's files, else a
    fetch of those refs), and a pass at once when one moved. 0: only the normal polls."""
    min_free_mb: float = 16.0
    """A pass stops before changing anything when the state dir's filesystem has less free (DISK_FULL)."""
    max_parallel: int = 8
    """How many services that do not depend on each other a pass starts, restarts and holds
    healthy at once (Nomad's word); 1: one after another. Side effects still take turns."""
    ssh_command: str | None = None
    """GIT_SSH_COMMAND for ssh:// remotes (key, port, known hosts)."""
    note_key: Path | None = None
    """The SSH private key this node signs its notes with (its public half is the node's line in
    the repo's ``trust/nodes``): the node's SSH key for the git server will do. None: a key the
    agent makes in the state dir on first use (lost with the state dir: keep one outside it)."""
    trust: TrustConfig = TrustConfig()
    """Who may sign the commits this node applies."""
    host: HostConfig = HostConfig()
    """The node's own OS, for the systemd and host drivers."""
    metrics: MetricsConfig = MetricsConfig()
    """Prometheus metrics (``/metrics``, textfile)."""
    notify: NotifyConfig = NotifyConfig()
    """Notifications (webhook, apprise)."""
    secrets: SecretsConfig = SecretsConfig()
    """Decrypting the repo's secrets on this node."""
    remotes: tuple[RemoteConfig, ...] = ()
    """Read mirrors and a write primary, in order: polls go to the first read remote that
    answers (the first again once it is back); notes are pushed to the write remote. Empty:
    ``remote`` does both."""
    docker: DockerConfig = DockerConfig()
    """The docker driver: registry logins for pulls."""
    receiver: ReceiverConfig = ReceiverConfig()
    """A webhook receiver that makes the daemon poll now (docs/day2.md)."""

    @property
    def read_urls(self) -> tuple[str, ...]:
        return tuple(r.url for r in self.remotes if r.reads) or (self.remote,)

    @property
    def write_url(self) -> str | None:
        """Where this node's notes go; None at a site with no write remote (kept until one is set)."""
        if not self.remotes:
            return self.remote
        return next((r.url for r in self.remotes if r.writes), None)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: str(v) if isinstance(v := getattr(self, f.name), Path) else v for f in fields(self)}
        out["remotes"] = [{"url": r.url, "role": r.role, **({"probe": r.probe, "check_every": r.check_every}
                                                           if r.probe else {})} for r in self.remotes]
        out["trust"] = self.trust.to_dict()
        out["host"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(self.host).items()}
        out["metrics"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(self.metrics).items()}
        hook = self.notify.webhook
        out["notify"] = {"webhook": vars(hook).copy() if hook else None, "apprise": list(self.notify.apprise)}
        out["secrets"] = {"age_identity": str(self.secrets.age_identity) if self.secrets.age_identity else None}
        out["receiver"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(self.receiver).items()}
        out["docker"] = {"registries": {r.registry: r.to_dict() for r in self.docker.registries}}
        return out
