"""Read-only views of a deployment repo: a git commit or a plain directory.

Both answer the same three questions, so loading and rendering never care where the bytes
come from: a node reads a verified commit from its mirror, a developer validates a work tree.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Protocol

import pygit2

from .errors import BadInput, CorruptMirror


class Tree(Protocol):
    label: str

    def read(self, path: str) -> bytes: ...

    def exists(self, path: str) -> bool: ...

    def listdir(self, path: str) -> list[str]: ...


def corrupt(repo: pygit2.Repository, exc: Exception) -> CorruptMirror:
    return CorruptMirror(f"{repo.path.rstrip('/')}: cannot read an object ({exc})")


@contextmanager
def reading(repo: pygit2.Repository) -> Iterator[None]:
    """Loading objects already named (a tree, a blob's data): any GitError there, "not found"
    included, is the object store failing, not a wrong name."""
    try:
        yield
    except pygit2.GitError as exc:
        raise corrupt(repo, exc) from exc


class GitTree:
    """The tree of one commit in a (bare) repository."""

    def __init__(self, repo: pygit2.Repository, commit: str) -> None:
        self._repo = repo
        try:
            self.commit = repo.revparse_single(commit).peel(pygit2.Commit)
        except (KeyError, ValueError) as exc:  # pygit2's NotFound and InvalidSpec errors are these
            raise BadInput(f"unknown revision {commit!r} in {repo.path}") from exc
        except pygit2.GitError as exc:
            raise corrupt(repo, exc) from exc
        self.label = str(self.commit.id)
        with reading(repo):
            self._tree = self.commit.tree

    def _entry(self, path: str) -> pygit2.Object | None:
        try:
            return self._tree[path] if path not in ("", ".") else self._tree
        except pygit2.GitError as exc:  # a subtree's object is missing or damaged (also a KeyError)
            raise corrupt(self._repo, exc) from exc
        except KeyError:
            return None

    def read(self, path: str) -> bytes:
        obj = self._entry(path)
        if not isinstance(obj, pygit2.Blob):
            raise FileNotFoundError(path)
        with reading(self._repo):
            return obj.data

    def exists(self, path: str) -> bool:
        return self._entry(path) is not None

    def listdir(self, path: str) -> list[str]:
        obj = self._entry(path)
        if not isinstance(obj, pygit2.Tree):
            return []
        with reading(self._repo):
            return sorted(e.name for e in obj if e.name is not None)


class DirTree:
    """A directory on disk, for validating and rendering before a commit exists."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.label = str(root)

    def _path(self, path: str) -> Path:
        rel = PurePosixPath(path)
        if rel.is_absolute() or ".." in rel.parts:
            raise FileNotFoundError(path)
        return self.root / rel

    def read(self, path: str) -> bytes:
        p = self._path(path)
        if not p.is_file():
            raise FileNotFoundError(path)
        return p.read_bytes()

    def exists(self, path: str) -> bool:
        return self._path(path).exists()

    def listdir(self, path: str) -> list[str]:
        p = self._path(path)
        return sorted(c.name for c in p.iterdir()) if p.is_dir() else []


def open_tree(repo_dir: Path, rev: str | None) -> Tree:
    """A directory that is a git repo is read at ``rev``; without ``rev``, as files on disk."""
    if rev is None:
        if not repo_dir.is_dir():
            raise BadInput(f"{repo_dir}: not a directory")
        return DirTree(repo_dir)
    try:
        repo = pygit2.Repository(str(repo_dir))
    except pygit2.GitError as exc:
        raise BadInput(f"{repo_dir}: not a git repository (needed for --rev)") from exc
    return GitTree(repo, rev)
