"""kolla's health checks for the stand-in image (standin.py, whose sibling this is: installed
as /usr/local/lib/kolla_standin_health.py), for real, from /proc (no ss, pgrep or curl in the
image); and the stand-in's way to fail."""

from __future__ import annotations

import base64
import contextlib
import os
import sys
import urllib.error
import urllib.request


def fail(message: str) -> None:
    print(f"ERROR: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def sockets() -> dict[str, tuple[int, tuple[str, int], tuple[str, int]]]:
    """inode -> (state, local, remote) of every TCP socket in this network namespace."""
    out = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(path) as f:
            for line in list(f)[1:]:
                cols = line.split()
                local, remote = (c.split(":") for c in cols[1:3])
                out[cols[9]] = (int(cols[3], 16), ("", int(local[1], 16)), ("", int(remote[1], 16)))
    return out


def processes(match: str, by_name: bool) -> dict[int, set[str]]:
    """pid -> socket inodes of this container's processes named ``match`` (``by_name``: the
    process name, as ss shows it; else anywhere in the command line, as pgrep -f)."""
    out: dict[int, set[str]] = {}
    me = {os.getpid(), os.getppid()}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) in me:
            continue
        with contextlib.suppress(OSError):
            if by_name:
                with open(f"/proc/{pid}/comm") as f:
                    found = f.read().strip() == match[:15]
            else:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    found = match.encode() in f.read().replace(b"\0", b" ")
            if found:
                inodes = set()
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        link = os.readlink(f"/proc/{pid}/fd/{fd}")
                        if link.startswith("socket:["):
                            inodes.add(link[8:-1])
                out[int(pid)] = inodes
    return out


LISTEN, ESTABLISHED = 0x0A, 0x01


def healthcheck_listen(process: str, port: str) -> None:
    """kolla's healthcheck_listen: ``process`` listens on ``port``."""
    table = sockets()
    for inodes in processes(process, by_name=True).values():
        if any(table.get(i, (0,))[0] == LISTEN and table[i][1][1] == int(port) for i in inodes):
            sys.exit(0)
    fail(f"no {process} process listening on port {port}")


def healthcheck_port(process: str, *ports: str) -> None:
    """kolla's healthcheck_port: ``process`` has a connection established to one of ``ports``."""
    table = sockets()
    found = processes(process, by_name=False)
    if not found:
        fail(f"there is no {process} process")
    for inodes in found.values():
        if any(table.get(i, (0,))[0] == ESTABLISHED and str(table[i][2][1]) in ports for i in inodes):
            sys.exit(0)
    fail(f"{process} has no connection to port {', '.join(ports)}")


def healthcheck_curl(args: list[str]) -> None:
    """kolla's healthcheck_curl: curl --fail on the URL (``-u user:password`` as curl's)."""
    url, request = args[-1], urllib.request.Request(args[-1] if "://" in args[-1] else f"http://{args[-1]}")
    if "-u" in args:
        request.add_header("Authorization", "Basic " + base64.b64encode(args[args.index("-u") + 1].encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
            print(f"{resp.status} {url}")
    except (urllib.error.URLError, OSError) as exc:
        fail(f"{url}: {exc}")
