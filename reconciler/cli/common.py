"""What every command shares: output options, the node's settings as options, the one way an
Agent is built from them, and the one way a failure carries a partial result to ``main``.

Kept apart from ``__init__`` so that the command modules import it and ``__init__`` imports
them, with no cycle.
"""

from __future__ import annotations

import errno
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from reconciler.agent import Agent
from reconciler.core.atomic import atomic_write
from reconciler.core.errors import BadInput, DiskFull, ReconcilerError
from reconciler.settings import AgentConfig, load_config

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from reconciler.ledger import Ledger

F = TypeVar("F", bound=Callable[..., Any])


class _LazyConsole:
    """A rich Console made on first use. The daemon prints nothing through it, and rich is
    ~5 MB of RSS and 100 ms of import it would otherwise carry for its whole life (issue 17)."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return getattr(self._console, name)


out: Any = _LazyConsole(highlight=False, soft_wrap=True)
err: Any = _LazyConsole(stderr=True, highlight=False, soft_wrap=True)


def new_table(*columns: str, **options: Any) -> Table:
    """A rich Table, rich imported only by the commands that print one."""
    from rich.table import Table

    return Table(*columns, **options)


def escape(text: str) -> str:
    """Text from a note, a repo or a service's output as one line of a table: control
    characters and escape sequences dropped (``core.text``), rich markup escaped (rich imported
    on first use, as above)."""
    from rich.markup import escape as rich_escape

    from reconciler.core.text import printable

    return rich_escape(printable(text))

STYLE = {"ok": "green", "applied": "green", "none": "dim", "failed": "red", "error": "red", "refused": "red",
         "halted": "yellow", "pending": "dim", "rebooting": "blue",
         "reload": "green", "recreate": "magenta", "connect": "blue", "drain+restart": "red", "reboot": "red",
         "skipped": "yellow", "start": "cyan", "restart": "yellow", "stop": "magenta",
         "done": "green", "started": "blue", "waiting": "dim", "undone": "yellow", "staged": "yellow",
         "pulled": "green", "present": "dim"}


def style(word: str) -> str:
    return f"[{STYLE.get(word, 'white')}]{escape(word)}[/]"


class Failed(Exception):
    """A command failed with something to show for it: under ``-o json`` ``main`` prints
    ``partial`` with the error in it, so a script reads one object whatever happened."""

    def __init__(self, error: ReconcilerError, partial: dict[str, Any]) -> None:
        super().__init__(str(error))
        self.error = error
        self.partial = partial


# click is imported where an option is declared or JSON written, not with this module: `agent`
# from ``entry`` uses the rest without it (issue 40).
def output_option(f: F) -> F:
    import click

    return click.option("-o", "--output", type=click.Choice(["human", "json"]), default="human",
                        show_default=True, help="Output format; json for scripts (errors too).")(f)


def forge_options(f: F) -> F:
    """Where a change is reviewed, as ``review-post`` and ``merge`` both take it: the forge, and
    the pull request (GitHub) or the change (Gerrit), from the options or a CI job's variables."""
    import click

    for option in reversed((
        click.option("--forge", type=click.Choice(["github", "gerrit"]), required=True),
        click.option("--pr", type=int, help="GitHub: the pull request's number."),
        click.option("--github-repo", envvar="GITHUB_REPOSITORY", help="GitHub: OWNER/NAME [$GITHUB_REPOSITORY]."),
        click.option("--api-url", envvar="GITHUB_API_URL", default="https://api.github.com", show_default=True,
                     help="GitHub: the REST API [$GITHUB_API_URL]."),
        click.option("--gerrit-url", envvar="GERRIT_URL", help="Gerrit: the server's URL [$GERRIT_URL]."),
        click.option("--change", envvar="GERRIT_CHANGE_NUMBER", help="Gerrit: the change [$GERRIT_CHANGE_NUMBER]."),
    )):
        f = option(f)
    return f


def emit_json(data: Any) -> None:
    import click

    click.echo(json.dumps(data, indent=2, sort_keys=True))


def output_dir(option: str, path: Path) -> None:
    """Make the directory an option names (``render --out DIR``), or say in one line why not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(option, path, None, path, exc) from exc


def write_output(option: str, path: Path, data: bytes, *, below: str | None = None, mode: int = 0o644,
                 durable: bool = True) -> None:
    """Write the file an option names (``--report-file FILE``), or the file ``below`` the directory
    it names (``--out DIR``). A path that cannot be written is the user's input (exit 2), said in
    one line with the system's reason; a full disk stays ``DiskFull`` (exit 1): room may come."""
    target = path / below if below else path
    try:
        atomic_write(target, data, mode, durable=durable)
    except OSError as exc:
        if target.is_dir():  # asked only now (render --out writes thousands): os.replace names its temp file
            raise BadInput(f"{option} {path}: {below + ': ' if below else ''}a directory, not a file") from exc
        raise _unwritable(option, path, below, target.parent, exc) from exc


def _unwritable(option: str, path: Path, below: str | None, directory: Path, exc: OSError) -> ReconcilerError:
    """Why ``below`` (or ``path`` itself) could not be written in ``directory``, in the user's terms."""
    where = f"{option} {path}"
    if exc.errno == errno.ENOSPC:
        return DiskFull.at(directory, f"cannot write {where}{': ' + below if below else ''}: no space left on device")
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):  # mkdir -p met a file on the way: name that file
        blocker = next((p for p in (*reversed(directory.parents), directory) if p.exists() and not p.is_dir()), None)
        if blocker == path:
            return BadInput(f"{where}: not a directory")
        if blocker is not None:
            name = blocker.relative_to(path) if blocker.is_relative_to(path) else blocker
            return BadInput(f"{where}: {name} is not a directory")
    reason = exc.strerror or str(exc)
    return BadInput(f"{where}: {below + ': ' if below else ''}{reason[:1].lower()}{reason[1:]}")


AGENT_KEYS = ("config_file", "node", "remote", "branch", "state_dir",
              "trust_allowed_signers", "trust_gpg_home", "trust_revoked", "trust_policy", "secrets_age_identity",
              "note_key")


def agent_options(f: F) -> F:
    """The node's settings as options, handed to the command as one ``agent_opts`` dict."""

    @functools.wraps(f)
    def wrapper(**kw: Any) -> Any:
        return f({k: kw.pop(k) for k in AGENT_KEYS}, **kw)

    import click

    path = click.Path(path_type=Path)
    for opt in reversed([
        click.option("--config", "config_file", type=path, envvar="RECONCILER_CONFIG",
                     help="Agent settings (YAML) [/etc/reconciler/agent.yaml, when it exists]. Flags override it."),
        click.option("--node", help="This node's name in inventory.yaml."),
        click.option("--remote", help="Deployment repo URL (file://, git://, ssh://, https://)."),
        click.option("--branch", help="Branch to follow [main]."),
        click.option("--state-dir", type=path, help="Local state directory."),
        click.option("--allowed-signers", "trust_allowed_signers", type=path,
                     help="Trust root: SSH allowed signers file (git's format)."),
        click.option("--gpg-home", "trust_gpg_home", type=path,
                     help="Trust root: GNUPGHOME with trusted OpenPGP keys."),
        click.option("--revoked", "trust_revoked", type=path,
                     help="Revoked keys, one per line: fingerprints or SSH public keys."),
        click.option("--trust-policy", "trust_policy", type=click.Choice(["every-commit", "first-parent", "head"]),
                     help="Which commits must be signed [every-commit]."),
        click.option("--age-identity", "secrets_age_identity", type=path,
                     help="This node's age identity file: decrypts the repo's secrets/*.yaml encrypted to it."),
        click.option("--note-key", "note_key", type=path,
                     help="The SSH private key this node signs its notes with (its line in the repo's trust/nodes) "
                          "[STATE_DIR/note_key, made on first use]."),
    ]):
        wrapper = opt(wrapper)
    return wrapper  # type: ignore[return-value]


DEFAULT_CONFIG = Path("/etc/reconciler/agent.yaml")


def default_config() -> Path | None:
    """The config a node's commands read when neither --config nor $RECONCILER_CONFIG names one:
    /etc/reconciler/agent.yaml, when it exists (an installed node needs no flags)."""
    try:
        return DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None
    except OSError:  # /etc/reconciler is root's (it holds the age key): a user's read command has none
        return None


def agent_config(agent_opts: dict[str, Any], *, node_of: Callable[[Path], str | None] | None = None,
                 **defaults: Any) -> AgentConfig:
    """The settings from --config and flags; ``defaults`` fill what neither gives (a read-only
    command passes a placeholder remote, since it never contacts one); ``node_of``: where the
    node is read from its state dir when neither names it."""
    opts = dict(agent_opts)
    config_file = opts.pop("config_file") or default_config()
    for key, value in defaults.items():
        if opts.get(key) is None:
            opts[key] = value
    return load_config(config_file, opts, node_of=node_of)


def node_agent(agent_opts: dict[str, Any], *, converge: bool = False, empty_ok: bool = True,
               **defaults: Any) -> Agent:
    """The one way a command builds this node's Agent from its options. ``converge``: the agent
    itself (`agent`, `apply`): it makes the state dir when there is none and records itself its
    owner. Any other command (plan, rollback, verify, prepull, suspend, `status --fleet`...) works
    on the state dir an agent made: the node read from there when not given, refused when another
    node's, or where no agent ran (a mistyped --state-dir would be made into a new node, and
    cloned); ``empty_ok``: an empty directory made for the node before its first run will do (a
    plan or a fleet view before it runs; not for what steers its runs: ``existing_agent``)."""
    if converge:
        return Agent(agent_config(agent_opts, **defaults))
    from reconciler.ledger.statedir import require_agent_state
    from reconciler.node.localfiles import check_local

    cfg = local_config(agent_opts, **defaults)
    check_local(cfg)  # this machine's own files first: a bad trust file is said as such anywhere
    require_agent_state(cfg.state_dir, empty_ok=empty_ok)
    return Agent(cfg, keeps=False)


def state_owner(root: Path, node: str | None = None) -> str | None:
    """The node whose agent keeps the state dir ``root`` (None: no ledger there, or an agent's
    from before it recorded its node); ``node``: refused when it is another's."""
    if not (root / "state.db").is_file():
        return None
    from reconciler.core.errors import ReconcilerError
    from reconciler.ledger import Ledger

    try:
        ledger = Ledger.open(root, create=False)
    except ReconcilerError as exc:
        if exc.reason != "LEDGER_ERROR":
            raise
        return None  # damaged: the command's own open says so, and how it heals (``Ledger.open``)
    try:
        if node is not None:
            ledger.claim(node, record=False)
        return ledger.owner()
    finally:
        ledger.close()


def _node_of(root: Path) -> str | None:
    """The node of the state dir ``root``, asked when the settings name none: a path that is not
    one is said as such, not as a missing --node (``--state-dir /typo`` alone)."""
    from reconciler.ledger.statedir import State, require_agent_state

    State(root, create=False)  # does not exist, or is a file
    require_agent_state(root, empty_ok=True)  # an empty one made ready: its node must be given
    return state_owner(root)


def local_config(agent_opts: dict[str, Any], **defaults: Any) -> AgentConfig:
    """The settings of a command on the node's existing state dir (status, logs, suspend...):
    the node it names when the settings name none; refused when they name another (it would be
    shown, or changed, under the wrong name)."""
    cfg = agent_config(agent_opts, node_of=_node_of, **defaults)
    state_owner(cfg.state_dir, cfg.node)
    return cfg


def existing_agent(agent_opts: dict[str, Any], *, empty_ok: bool = False) -> Agent:
    """The Agent of a command that steers the node between passes (suspend, resume, retry,
    unpin): ``node_agent``'s, over a state dir its agent made (``empty_ok``: suspend's, a node
    that starts out suspended)."""
    return node_agent(agent_opts, empty_ok=empty_ok)


def in_flight(ledger: Ledger) -> list[dict[str, str]]:
    """What a pass began on this node and has not seen through, oldest first: a service action
    it journalled ({service, action, commit}), an upgrade step it began ({service, action:
    "step", step, commit}; service "" for a post step). What runs may be the new version, not
    yet seen healthy, or a service an upgrade stopped. Said by Ctrl-C and by ``status``."""
    items = [{"service": i.service, "action": str(i.action), "commit": i.commit} for i in ledger.interrupted()]
    items += [{"service": r.service, "action": "step", "step": r.step, "commit": commit}
              for commit, r in ledger.steps_started()]
    return items


def flight_text(item: dict[str, str]) -> str:
    """One of ``in_flight`` in words: ``restart web at C``, ``step migrate of web's upgrade at C``."""
    if item["action"] != "step":
        return f"{item['action']} {item['service']} at {item['commit'][:12]}"
    whose = f"{item['service']}'s upgrade" if item["service"] else "the post-upgrade steps"
    return f"step {item['step']} of {whose} at {item['commit'][:12]}"
