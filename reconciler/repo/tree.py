"""Read-only views of a deployment repo: a git commit or a plain directory.

Both answer the same questions, so loading and rendering never care where the bytes come
from: a node reads a verified commit from its mirror, a developer validates a work tree.

Only regular files and directories are read. A symlink on the way to a path the loader reads is
a ``RepoSymlink`` naming it, in a commit (a tree entry of mode 120000) and on disk alike: in a
work tree it would put bytes from outside the reviewed tree (``/etc/passwd``) into a node's
files or a review comment, and in a commit it means something else than on disk. On disk, each
step is opened relative to its parent without following links, so a link swapped in while we
read is refused too.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Protocol

import pygit2
from pygit2.enums import FileMode

from reconciler.core.errors import BadInput, CorruptMirror, RepoLimit, RepoSymlink
from reconciler.core.limits import size


class Tree(Protocol):
    label: str

    def read(self, path: str, max_bytes: int | None = None) -> bytes:
        """The file's bytes. FileNotFoundError if missing; ``RepoLimit`` past ``max_bytes``;
        ``RepoSymlink`` for a link on the way; ``BadInput`` for a directory or anything else
        that is not a regular file."""
        ...

    def exists(self, path: str) -> bool:
        """Whether anything is there, a symlink included (reading it says what is wrong)."""
        ...

    def listdir(self, path: str) -> list[str]:
        """Sorted names in a directory; [] when it is missing or not a directory."""
        ...

    def files(self, path: str) -> list[str]:
        """Every file below a directory, recursively, as sorted repo paths; [] when missing."""
        ...


def _symlink(path: str, target: str) -> RepoSymlink:
    return RepoSymlink(f"a symlink (to {target!r}): not allowed in a deployment repo", file=path)


def _a_directory(path: str) -> BadInput:
    # Not "missing": the operator sees the path exists and would look for a typo that is not there.
    return BadInput("a directory, not a file", file=path)


def _too_large(path: str, max_bytes: int) -> RepoLimit:
    return RepoLimit(f"larger than {size(max_bytes)} (repo limit)", file=path)


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
        """Walked one name at a time, so a link anywhere on the way is seen, not only at the end."""
        node: pygit2.Object = self._tree
        walked = ""
        try:
            for part in path.split("/") if path not in ("", ".") else ():
                if not isinstance(node, pygit2.Tree) or part not in node:
                    return None
                node = node[part]
                walked = f"{walked}/{part}" if walked else part
                if node.filemode == FileMode.LINK:
                    assert isinstance(node, pygit2.Blob)
                    raise _symlink(walked, node.data.decode(errors="replace"))
        except pygit2.GitError as exc:  # a subtree's object is missing or damaged
            raise corrupt(self._repo, exc) from exc
        return node

    def read(self, path: str, max_bytes: int | None = None) -> bytes:
        obj = self._entry(path)
        if obj is None:
            raise FileNotFoundError(path)
        if isinstance(obj, pygit2.Tree):
            raise _a_directory(path)
        if not isinstance(obj, pygit2.Blob):
            raise BadInput("not a regular file (a submodule?)", file=path)
        with reading(self._repo):
            if max_bytes is not None and obj.size > max_bytes:
                raise _too_large(path, max_bytes)
            return obj.data

    def exists(self, path: str) -> bool:
        try:
            return self._entry(path) is not None
        except RepoSymlink:
            return True

    def listdir(self, path: str) -> list[str]:
        obj = self._entry(path)
        if not isinstance(obj, pygit2.Tree):
            return []
        with reading(self._repo):
            return sorted(e.name for e in obj if e.name is not None)

    def files(self, path: str) -> list[str]:
        obj = self._entry(path)
        if not isinstance(obj, pygit2.Tree):
            return []
        out: list[str] = []
        for entry in obj:
            rel = f"{path}/{entry.name}"
            if entry.filemode == FileMode.LINK:
                self._entry(rel)  # raises, naming the link and its target
            out.extend(self.files(rel) if isinstance(entry, pygit2.Tree) else [rel])
        return sorted(out)


class DirTree:
    """A directory on disk, for validating and rendering before a commit exists."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.label = str(root)

    def _open(self, path: str, *, directory: bool) -> int:
        """A file descriptor for ``path``, each name opened below the last with O_NOFOLLOW."""
        rel = PurePosixPath(path)
        if rel.is_absolute() or ".." in rel.parts:
            raise FileNotFoundError(path)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for i, part in enumerate(rel.parts):
                last = i == len(rel.parts) - 1
                # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
                kind = os.O_DIRECTORY if directory or not last else os.O_NONBLOCK
                try:
                    inner = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | kind, dir_fd=fd)
                except OSError as exc:
                    walked = "/".join(rel.parts[: i + 1])
                    try:
                        is_link = stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode)
                    except OSError:
                        is_link = False
                    if is_link:
                        raise _symlink(walked, os.readlink(part, dir_fd=fd)) from None
                    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                        raise FileNotFoundError(walked) from exc
                    raise BadInput(f"cannot read: {exc.strerror}", file=walked) from exc
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(self, path: str, max_bytes: int | None = None) -> bytes:
        fd = self._open(path, directory=False)
        # Checked before fdopen, which raises IsADirectoryError for a directory and leaves the fd open.
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise _a_directory(path)
            if not stat.S_ISREG(mode):
                raise BadInput("not a regular file", file=path)
        except BaseException:
            os.close(fd)
            raise
        with os.fdopen(fd, "rb") as f:
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:
            raise _too_large(path, max_bytes)
        return data

    def exists(self, path: str) -> bool:
        try:
            os.close(self._open(path, directory=False))
        except FileNotFoundError:
            return False
        except RepoSymlink:
            return True
        return True

    def _scan(self, path: str) -> list[os.DirEntry[str]]:
        try:
            fd = self._open(path, directory=True)
        except FileNotFoundError:
            return []
        try:
            with os.scandir(fd) as entries:
                return sorted(entries, key=lambda e: e.name)
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[str]:
        return [e.name for e in self._scan(path)]

    def files(self, path: str) -> list[str]:
        out: list[str] = []
        for entry in self._scan(path):
            rel = f"{path}/{entry.name}"
            if entry.is_symlink():
                os.close(self._open(rel, directory=False))  # raises, naming the link and its target
            out.extend(self.files(rel) if entry.is_dir(follow_symlinks=False) else [rel])
        return sorted(out)


def open_tree(repo_dir: Path, rev: str | None, needs: str = "--rev") -> Tree:
    """A directory that is a git repo is read at ``rev``; without ``rev``, as files on disk.
    ``needs``: what of the command line wants a git repo, named when it is not one."""
    if rev is None:
        if not repo_dir.is_dir():
            raise BadInput(f"{repo_dir}: not a directory")
        return DirTree(repo_dir)
    try:
        repo = pygit2.Repository(str(repo_dir))
    except pygit2.GitError as exc:
        raise BadInput(f"{repo_dir}: not a git repository (needed for {needs})") from exc
    return GitTree(repo, rev)
