"""The command line: thin. The only place that prints errors and picks exit codes.

Exit codes: 0 ok, 1 failed (a service, the remote), 2 bad input (repo, config, arguments).
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__
from .agent import Agent, RunResult
from .atomic import atomic_write
from .config import AgentConfig, load_config
from .errors import BadInput, ReconcilerError
from .model import Desired
from .observe import observe

F = TypeVar("F", bound=Callable[..., Any])
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

STYLE = {"ok": "green", "applied": "green", "none": "dim", "failed": "red", "error": "red", "refused": "red",
         "halted": "yellow", "pending": "dim", "rebooting": "blue",
         "reload": "green", "recreate": "magenta", "connect": "blue", "drain+restart": "red", "reboot": "red",
         "skipped": "yellow", "start": "cyan", "restart": "yellow", "stop": "magenta"}


def _style(word: str) -> str:
    return f"[{STYLE.get(word, 'white')}]{word}[/]"


def output_option(f: F) -> F:
    return click.option("-o", "--output", type=click.Choice(["human", "json"]), default="human",
                        show_default=True, help="Output format; json for scripts.")(f)


AGENT_KEYS = ("config_file", "node", "remote", "branch", "state_dir",
              "trust_allowed_signers", "trust_gpg_home", "trust_revoked", "trust_policy")


def agent_options(f: F) -> F:
    """The node's settings as options, handed to the command as one ``agent_opts`` dict."""

    @functools.wraps(f)
    def wrapper(**kw: Any) -> Any:
        return f({k: kw.pop(k) for k in AGENT_KEYS}, **kw)

    path = click.Path(path_type=Path)
    for opt in reversed([
        click.option("--config", "config_file", type=path, envvar="RECONCILER_CONFIG",
                     help="Agent settings (YAML). Flags override it."),
        click.option("--node", help="This node's name in inventory.yaml."),
        click.option("--remote", help="Deployment repo URL (file://, git://, ssh://, https://)."),
        click.option("--branch", help="Branch to follow [main]."),
        click.option("--state-dir", type=path, help="Local state directory."),
        click.option("--allowed-signers", "trust_allowed_signers", type=path,
                     help="Trust root: SSH allowed signers file (git's format)."),
        click.option("--gpg-home", "trust_gpg_home", type=path,
                     help="Trust root: GNUPGHOME with trusted OpenPGP keys."),
        click.option("--revoked", "trust_revoked", type=path, help="Revoked key fingerprints, one per line."),
        click.option("--trust-policy", "trust_policy", type=click.Choice(["every-commit", "first-parent", "head"]),
                     help="Which commits must be signed [every-commit]."),
    ]):
        wrapper = opt(wrapper)
    return wrapper  # type: ignore[return-value]


def _config(agent_opts: dict[str, Any], **extra: Any) -> AgentConfig:
    opts = dict(agent_opts)
    config_file = opts.pop("config_file")
    for key, value in extra.items():
        if opts.get(key) is None:
            opts[key] = value
    return load_config(config_file, opts)


def _json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="reconciler")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """Pull-based GitOps agent: every node converges on the reviewed deployment repo.

    \b
    Example:
      reconciler validate --repo examples/repo
      reconciler agent --once --node ctl1 --remote file:///srv/cloud.git --state-dir /tmp/ctl1 \\
          --allowed-signers /etc/reconciler/allowed_signers
    """
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")


# ---------------------------------------------------------------------------- validate
@cli.command()
@click.option("--repo", "repo_dir", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="Deployment repo: a directory, or a git repo when --rev is given.")
@click.option("--rev", help="Check this commit instead of the files on disk.")
@output_option
def validate(repo_dir: Path, rev: str | None, output: str) -> None:
    """Check schemas and references, and render every node.

    Each problem is printed as file:line: message; exit 2 if there is any.

    \b
    Example:
      reconciler validate --repo examples/repo
      reconciler validate --repo . --rev HEAD
    """
    from .render import render_node
    from .repo import load_repo
    from .tree import open_tree
    from .yamlfile import Problem, RepoProblems

    tree = open_tree(repo_dir, rev)
    problems: list[Problem] = []
    nodes = services = 0
    try:
        repo = load_repo(tree)
    except RepoProblems as exc:
        problems = exc.problems
    else:
        for node in sorted(repo.nodes):
            try:
                services += len(render_node(repo, node, tree.label).services)
                nodes += 1
            except BadInput as exc:
                message = str(exc).split(": ", 1)[1] if exc.file else str(exc)
                problems.append(Problem(exc.file or "?", exc.line, message))
    if output == "json":
        _json({"ok": not problems, "nodes": nodes, "services": services,
               "problems": [{"file": p.file, "line": p.line, "message": p.message} for p in problems]})
    else:
        for p in problems:
            click.echo(str(p), err=True)
        if not problems:
            out.print(f"[green]ok[/]: {tree.label}: {nodes} nodes, {services} service instances render")
    if problems:
        sys.exit(2)


# ---------------------------------------------------------------------------- render
@cli.command()
@click.option("--repo", "repo_dir", type=click.Path(path_type=Path), default=Path("."), show_default=True)
@click.option("--rev", help="Render this commit instead of the files on disk.")
@click.option("--node", "nodes", multiple=True, help="Node to render (repeatable).")
@click.option("--all", "all_nodes", is_flag=True, help="Render every node.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), help="Write the files per node here.")
@output_option
def render(repo_dir: Path, rev: str | None, nodes: tuple[str, ...], all_nodes: bool,
           out_dir: Path | None, output: str) -> None:
    """Render nodes' slices for review: OUT/<node>/<service>/<file>.

    Same commit, same bytes. Without --out, prints each service's hash and files.

    \b
    Example:
      reconciler render --repo examples/repo --all --out /tmp/rendered
      reconciler render --repo . --rev HEAD --node ctl1 -o json
    """
    from .render import render_node
    from .repo import load_repo
    from .tree import open_tree

    if not nodes and not all_nodes:
        raise BadInput("give --node NODE or --all")
    tree = open_tree(repo_dir, rev)
    repo = load_repo(tree)
    names = sorted(repo.nodes) if all_nodes else list(nodes)
    slices = [render_node(repo, n, tree.label) for n in names]
    if out_dir is not None:
        for d in slices:
            _write_slice(out_dir, d)
    if output == "json":
        _json([d.to_dict() for d in slices])
        return
    table = Table("node", "service", "driver", "hash", "files")
    for d in slices:
        for s in d.services:
            table.add_row(d.node, s.name, s.runtime.driver, s.hash[:12], ", ".join(f.path for f in s.files))
    out.print(table)
    if out_dir is not None:
        out.print(f"written under {out_dir}")


def _write_slice(root: Path, desired: Desired) -> None:
    for s in desired.services:
        base = root / desired.node / s.name
        for f in s.files:
            atomic_write(base / f.path, f.content, f.mode)
        spec = {"runtime": s.runtime.to_dict(), "health": s.health.to_dict(), "hash": s.hash,
                "depends_on": list(s.depends_on)}
        atomic_write(base / "service.json", (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode())


@cli.command()
@click.argument("rev_a")
@click.argument("rev_b")
@click.option("--repo", "repo_dir", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="The deployment repo (a git repo holding both commits).")
@click.option("--node", "nodes", multiple=True, help="Only this node (repeatable); default: every node.")
@click.option("--all", "all_nodes", is_flag=True, help="Every node (the default).")
@click.option("-o", "--output", type=click.Choice(["human", "json", "markdown"]), default="human", show_default=True,
              help="markdown: a pull-request comment.")
def diff(rev_a: str, rev_b: str, repo_dir: Path, nodes: tuple[str, ...], all_nodes: bool, output: str) -> None:
    """What REV_B will do on each node, compared with REV_A: changed files and actions.

    Each node's plan hash is the one the node writes in its note when it applies REV_B, so a
    reviewer can check that what ran is what was reviewed.

    \b
    Example:
      reconciler diff --repo . origin/main HEAD
      reconciler diff --repo . main feature --node ctl1 -o markdown > comment.md
    """
    from .repo import load_repo
    from .review import diff_repos, markdown, summary
    from .tree import open_tree

    tree_a, tree_b = open_tree(repo_dir, rev_a), open_tree(repo_dir, rev_b)
    diffs = diff_repos(load_repo(tree_a), tree_a.label, load_repo(tree_b), tree_b.label,
                       None if all_nodes or not nodes else list(nodes))
    if output == "json":
        _json({"from": tree_a.label, "to": tree_b.label, "summary": summary(diffs),
               "nodes": [d.to_dict() for d in diffs]})
        return
    if output == "markdown":
        click.echo(markdown(diffs, tree_a.label, tree_b.label), nl=False)
        return
    from rich.syntax import Syntax

    for d in diffs:
        if not d.plan.changes and not d.files:
            continue
        out.rule(f"{d.node}  (plan {d.plan.hash})")
        for f in d.files:
            out.print(Syntax(f.text, "diff", theme="ansi_dark", background_color="default"))
        table = Table("service", "action", "reason")
        for a in d.plan.changes:
            table.add_row(a.service, _style(str(a.kind)), escape(a.reason))
        out.print(table)
    summ = summary(diffs)
    unchanged = sum(1 for d in diffs if not d.plan.changes)
    parts = [f"{v['nodes']} node{'s' if v['nodes'] != 1 else ''} {k} ({v['services']} service"
             f"{'s' if v['services'] != 1 else ''})" for k, v in summ.items()]
    out.print("summary: " + ("; ".join(parts) if parts else "no node changes")
              + f"; {unchanged} of {len(diffs)} nodes unchanged")


# ---------------------------------------------------------------------------- plan / apply
@cli.command()
@agent_options
@click.option("--rev", help="Plan this commit of the node's mirror instead of the branch head.")
@click.option("--no-fetch", is_flag=True, help="Use the mirror as it is; do not contact the remote.")
@output_option
def plan(agent_opts: dict[str, Any], rev: str | None, no_fetch: bool, output: str) -> None:
    """Show what this node would do for the branch head, and why. Changes nothing.

    \b
    Example:
      reconciler plan --config /etc/reconciler/agent.yaml
    """
    cfg = _config(agent_opts)
    agent = Agent(cfg)
    the_plan, _ = agent.plan(fetch=not no_fetch and rev is None, rev=rev)
    if output == "json":
        _json(the_plan.to_dict())
        return
    table = Table("service", "action", "reason", title=f"{cfg.node} @ {the_plan.commit[:12]} (plan {the_plan.hash})")
    for a in the_plan.actions:
        table.add_row(a.service, _style(str(a.kind)), escape(a.reason))
    out.print(table)
    n = len(the_plan.changes)
    out.print(f"{n} change{'s' if n != 1 else ''}" if n else "nothing to do")


def _print_result(result: RunResult, output: str) -> None:
    if output == "json":
        _json(result.to_dict())
        return
    short = result.commit[:12]
    for c, s, a in result.interrupted:
        err.print(f"[yellow]note[/]: a previous run was interrupted during {a} {s} at {c[:12]}")
    if result.report is None and result.waiting:
        out.print(f"{result.node} @ {short}: not yet: {escape(result.waiting)}")
    elif result.report is None:
        out.print(f"{result.node} @ {short}: unchanged, nothing to do")
    else:
        rep = result.report
        if rep.services:
            table = Table("service", "action", "result", "reason", "detail",
                          title=f"{result.node} @ {short}: {rep.state}")
            for r in rep.services:
                table.add_row(r.service, _style(str(r.action)), _style(str(r.state)), escape(r.reason),
                              escape(r.detail))
            out.print(table)
        else:
            out.print(f"{result.node} @ {short}: {_style(str(rep.state))}")
    if not result.pushed:
        err.print("[yellow]warning[/]: the note could not be pushed; it will be pushed on the next run")
    if result.error is not None:
        raise result.error


@cli.command()
@agent_options
@click.argument("commit", required=False)
@click.option("--rev", help="Same as COMMIT.")
@click.option("--service", "services", multiple=True, help="Only this service (repeatable).")
@click.option("--no-fetch", is_flag=True, help="Apply what the mirror has; do not contact the remote.")
@output_option
def apply(agent_opts: dict[str, Any], commit: str | None, rev: str | None, services: tuple[str, ...],
          no_fetch: bool, output: str) -> None:
    """Converge this node on the branch head (or COMMIT) now, and note the result. This is
    also how services under `apply: manual`, which the agent only stages, are instantiated.

    \b
    Example:
      reconciler apply --config /etc/reconciler/agent.yaml
      reconciler apply --config /etc/reconciler/agent.yaml --service identity
    """
    cfg = _config(agent_opts)
    agent = Agent(cfg)
    rev = commit or rev
    result = agent.reconcile_once(fetch=not no_fetch and rev is None, rev=rev, instantiate=True,
                                  only=set(services) or None)
    _print_result(result, output)
    sys.exit(result.exit_code)


@cli.command()
@agent_options
@click.option("--once", is_flag=True, help="Run one pass (poll, apply, report) and exit.")
@click.option("--interval", type=float, help="Seconds between polls.")
@click.option("--jitter", type=float, help="Random extra seconds per poll.")
@output_option
def agent(agent_opts: dict[str, Any], once: bool, interval: float | None, jitter: float | None,
          output: str) -> None:
    """Run the agent: poll the repo, apply, report; supervise services in between.

    \b
    Example:
      reconciler agent --config /etc/reconciler/agent.yaml
      reconciler agent --once --node ctl1 --remote file:///srv/cloud.git --state-dir /tmp/ctl1 \\
          --allowed-signers /etc/reconciler/allowed_signers
    """
    cfg = _config(agent_opts, interval=interval, jitter=jitter)
    the_agent = Agent(cfg)
    if once:
        result = the_agent.reconcile_once()
        _print_result(result, output)
        sys.exit(result.exit_code)
    from .daemon import run_daemon

    if logging.getLogger().level > logging.INFO:
        logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("apscheduler").setLevel(logging.ERROR)  # "skipped: already running" is normal
    run_daemon(the_agent)


@cli.command()
@agent_options
@click.argument("spec", required=False)
@click.option("--repo", "repo_dir", type=click.Path(path_type=Path),
              help="Verify in this git repo instead of the node's mirror (no node settings needed).")
@click.option("--no-fetch", is_flag=True, help="Use the mirror as it is; do not contact the remote.")
@output_option
def verify(agent_opts: dict[str, Any], spec: str | None, repo_dir: Path | None, no_fetch: bool, output: str) -> None:
    """Check commits against this node's trust root: REV (default the branch head) or A..B.

    Prints each commit's verdict and signer; exit 2 if any is refused.

    \b
    Example:
      reconciler verify --config /etc/reconciler/agent.yaml HEAD~5..HEAD
      reconciler verify --repo . --allowed-signers ./allowed_signers origin/main
    """
    import pygit2

    from .trust import Gate, Policy, load_root, verify_range

    if repo_dir is not None:
        cfg = _config(agent_opts, node="local", remote="unused")
        t = cfg.trust
        node_root = load_root(t.allowed_signers, t.gpg_home, t.revoked)
        if node_root.empty:
            raise BadInput("no trust root: give --allowed-signers and/or --gpg-home")
        try:
            repo = pygit2.Repository(str(repo_dir))
        except pygit2.GitError as exc:
            raise BadInput(f"{repo_dir}: not a git repository") from exc
        gate = Gate(node_root, Policy(t.policy), node_revoked=node_root.revoked)
        verdicts = verify_range(repo, spec or "HEAD", gate)
    else:
        the_agent = Agent(_config(agent_opts))
        with the_agent.state.lock(wait=30):
            head, _ = the_agent.head(fetch=not no_fetch, rev=None)
        verdicts = verify_range(the_agent.source.repo, spec or head, the_agent.gate)
    if output == "json":
        _json([v.to_dict() for v in verdicts])
    else:
        table = Table("commit", "verdict", "reason", "format", "signer", "key")
        for v in verdicts:
            table.add_row(v.commit[:12], _style("ok") if v.ok else _style("refused"), escape(v.message or v.reason),
                          v.format, v.principal, v.fingerprint)
        out.print(table)
    if not all(v.ok for v in verdicts):
        sys.exit(2)


# ---------------------------------------------------------------------------- status / history
@cli.command()
@agent_options
@click.option("--fleet", is_flag=True, help="The whole rollout from every node's notes (fetches them).")
@click.option("--rev", help="With --fleet: the commit to show [the branch head].")
@click.option("--html", "html_file", type=click.Path(path_type=Path), help="With --fleet: also write a page.")
@output_option
def status(agent_opts: dict[str, Any], fleet: bool, rev: str | None, html_file: Path | None, output: str) -> None:
    """What runs on this node now, from which commit, and the last run's verdict; with --fleet,
    every node's state for a commit, per wave.

    \b
    Example:
      reconciler status --config /etc/reconciler/agent.yaml -o json
      reconciler status --fleet --config /etc/reconciler/agent.yaml --html rollout.html
    """
    if fleet:
        _fleet_status(agent_opts, rev, html_file, output)
        return
    cfg = _config(agent_opts, remote="unused")
    from .agent import drivers_for
    from .ledger import Ledger
    from .state import State

    State(cfg.state_dir, create=False)
    ledger = Ledger.open(cfg.state_dir, create=False)
    observed = observe(cfg.node, drivers_for(cfg, None))
    last = ledger.last_run()
    head = ledger.mark().commit
    record = ledger.record(head) if head else None
    converged = ledger.converged()
    applied = converged[0] if converged else None
    pins = [p.to_dict() for p in ledger.pins()]
    if output == "json":
        _json({"node": cfg.node, "head": head, "verdict": str(record.verdict) if record else None,
               "applied_commit": applied, "pins": pins, "last_run": last, **observed.to_dict()})
        return
    out.print(f"node {cfg.node}: head {head[:12] if head else 'none yet'}"
              + (f" {_style(str(record.verdict))}" if record else "")
              + (f"; last run {last['commit'][:12]} {_style(last['state'])}" if last else ""))
    table = Table("service", "driver", "running", "pid", "commit", "hash", "pinned")
    pinned = {p["service"]: p["commit"] for p in pins}
    for s in observed.services:
        table.add_row(s.name, s.driver, _style("ok") if s.running else _style("failed"), str(s.pid or "-"),
                      (s.commit or "")[:12], (s.hash or "")[:12], pinned.get(s.name, "")[:12])
    out.print(table)


@cli.command()
@agent_options
@click.argument("service", required=False)
@click.option("--limit", default=30, show_default=True)
@output_option
def history(agent_opts: dict[str, Any], service: str | None, limit: int, output: str) -> None:
    """What this node applied, per service, newest first.

    \b
    Example:
      reconciler history identity --state-dir /var/lib/reconciler
    """
    cfg = _config(agent_opts, node="local", remote="unused")
    from datetime import UTC, datetime

    from .ledger import Ledger
    from .state import State

    State(cfg.state_dir, create=False)
    rows = Ledger.open(cfg.state_dir, create=False).history(service, limit)
    if output == "json":
        _json([r.to_dict() for r in rows])
        return
    table = Table("time", "service", "commit", "action", "result", "reason")
    for r in rows:
        when = datetime.fromtimestamp(r.time, UTC).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(when, r.service, r.commit[:12], r.action, _style(r.result), escape(r.detail or r.reason))
    out.print(table)


def _fleet_status(agent_opts: dict[str, Any], rev: str | None, html_file: Path | None, output: str) -> None:
    from .fleet import counts, fleet_status, to_html
    from .rollout import plan_rollout

    the_agent = Agent(_config(agent_opts))
    with the_agent.state.lock(wait=30):
        head, _ = the_agent.head(fetch=True, rev=None)
        commit = head if rev is None else the_agent.head(fetch=False, rev=rev)[0]
        fleet_view = the_agent.fleet_view()
    repo = the_agent.load(commit)  # for the order of the waves only: nothing is applied
    rollout = plan_rollout(repo.settings, repo.nodes, repo.members)
    statuses = fleet_status(rollout, sorted(repo.nodes), commit, fleet_view)
    if html_file is not None:
        atomic_write(html_file, to_html(statuses, commit, f"{repo.name}: rollout of {commit[:12]}").encode())
    if output == "json":
        _json({"commit": commit, "counts": counts(statuses), "nodes": [s.to_dict() for s in statuses]})
        return
    table = Table("wave", "node", "state", "detail", title=f"{repo.name} @ {commit[:12]}")
    for s in statuses:
        table.add_row(s.wave, s.node, _style(s.state), escape(s.detail))
    out.print(table)
    out.print(", ".join(f"{v} {k}" for k, v in counts(statuses).items()))


@cli.command()
@agent_options
@click.argument("service")
@click.option("--to", "to", help="Commit to put the service back to [its previous good one].")
@output_option
def rollback(agent_opts: dict[str, Any], service: str, to: str | None, output: str) -> None:
    """Put one service on this node back to an earlier version, now, without the git server,
    and pin it there until the branch moves on or `reconciler unpin SERVICE`.

    The fleet's rollback is `git revert` (a reviewed commit); this is the node's.

    \b
    Example:
      reconciler rollback identity --config /etc/reconciler/agent.yaml
      reconciler rollback identity --to 3f2a9c1 --config /etc/reconciler/agent.yaml
    """
    result = Agent(_config(agent_opts)).rollback(service, to)
    _print_result(result, output)
    sys.exit(result.exit_code)


@cli.command()
@agent_options
@click.argument("service")
def unpin(agent_opts: dict[str, Any], service: str) -> None:
    """Release a pin made by `rollback`: the next run brings SERVICE to the branch head.

    \b
    Example:
      reconciler unpin identity --config /etc/reconciler/agent.yaml
    """
    the_agent = Agent(_config(agent_opts))
    released = the_agent.unpin(service)
    if not released:
        raise BadInput(f"service {service} is not pinned on node {the_agent.cfg.node}", reason="NOT_PINNED")
    out.print(f"{service}: pin released; the next run applies the branch head")


@cli.command()
@agent_options
def retry(agent_opts: dict[str, Any]) -> None:
    """Try the branch head again on this node after it failed here (it is not retried on its own).

    \b
    Example:
      reconciler retry --config /etc/reconciler/agent.yaml && reconciler apply --config ...
    """
    failed = Agent(_config(agent_opts)).retry()
    out.print(f"will try {failed[:12]} again on the next run" if failed else "nothing to retry")


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        err.print("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except ReconcilerError as exc:
        click.echo(f"error: {exc} [{exc.reason}]", err=True)
        sys.exit(exc.exit_code)
    except SystemExit:
        raise

