"""``reconciler bundle``: the deployment repo for a site with no network."""

from __future__ import annotations

from pathlib import Path

import click

from reconciler.cli.common import emit_json, out, output_option
from reconciler.core.errors import BadInput


@click.group()
def bundle() -> None:
    """Git bundles for offline and air-gapped sites (`bundle create --help`; -o json there).

    \b
    Example:
      reconciler bundle create --remote origin 1a2b3c4..main /media/usb/cloud.bundle

    \b
    Exit codes:
      0  written
      1  the remote did not answer
      2  bad input (see `bundle create --help`)
    """


@bundle.command("create")
@click.argument("revisions", metavar="[SINCE..]BRANCH")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--repo", "repo_dir", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="A clone of the deployment repo.")
@click.option("--remote", help="Take the branch and the nodes' notes from this remote of --repo (a name or a "
                               "URL) instead of the clone's own refs.")
@output_option
def create(revisions: str, file: str, repo_dir: Path, remote: str | None, output: str) -> None:
    """Write BRANCH past SINCE (a commit the site has; none: the whole history) and every
    node's notes into FILE, for a site's agents to read as a remote.

    \b
    Example:
      reconciler bundle create --remote origin 1a2b3c4..main /media/usb/cloud.bundle
    On the site, in the agent config:
      remotes: [{url: /media/usb/cloud.bundle, role: read}]

    \b
    Exit codes:
      0  written
      1  the remote did not answer
      2  bad input: not a clone, an unknown branch or commit, SINCE not an ancestor of BRANCH,
         nothing past SINCE; FILE not a file name, in a missing directory or not a regular file
    """
    import pygit2

    from reconciler.source.bundles import create as make

    since, _, branch = revisions.rpartition("..")
    if not branch:
        raise BadInput(f"{revisions!r}: give BRANCH or SINCE..BRANCH")
    if Path(file).name in ("", ".", ".."):  # Path("") is ".": the bundle would be renamed over a directory
        raise BadInput(f"FILE {file!r}: not a file name")
    try:
        repo = pygit2.Repository(str(repo_dir))
    except pygit2.GitError as exc:
        raise BadInput(f"{repo_dir}: not a git repository (give --repo, a clone of the deployment repo)") from exc
    source = str(repo_dir.resolve())
    if remote is not None:
        from reconciler.fleet.view import remote_source

        source = remote_source(repo, repo_dir, remote)
    made = make(source, branch, since or None, Path(file))
    if output == "json":
        emit_json({"file": str(made.path), "head": made.head, "since": made.since, "notes": list(made.notes)})
        return
    span = f"{made.since[:12]}..{made.head[:12]}" if made.since else f"up to {made.head[:12]}"
    out.print(f"{made.path}: {branch} {span}, notes of {len(made.notes)} node(s)")
