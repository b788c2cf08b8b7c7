"""Where the deployment repo is: ``remote`` and ``remotes``, in a form git reads, checked as
settings. A URL git cannot fetch from is no fault of the network and no retry mends it: said
here, exit 2, not found at every poll as REMOTE_UNREACHABLE.

No message repeats what follows a URL's scheme: it may hold a user name and password.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Any
from urllib.parse import urlsplit

from reconciler.core.yamlfile import near
from reconciler.settings.agent import ROLES, RemoteConfig
from reconciler.settings.problems import At, Problems, name_of
from reconciler.settings.sections import WEEK, number

# The URL schemes git fetches from (git-fetch(1) "GIT URLS"). Any other ``x://`` would have git
# look for a helper ``git-remote-x``: a typo (``htps://``) failing at every poll as a network fault.
SCHEMES = ("file", "ssh", "git", "http", "https", "git+ssh", "ssh+git")
FORMS = "file:///path, ssh://host/path, git://host/path, https://host/path, user@host:path or a local path"

# A scheme short of a slash: ``https:/host/x`` (git: ssh to a host named https) or ``http//host/x``
# (git: a local directory named http).
_SHORT = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)(:/|//)(?!/)")


def remote_url(url: str, p: Problems, at: At, *, flag: bool = False) -> str:
    """A plain local path is taken as a file:// URL (absolute), like git does; a git bundle
    (``bundle:///media/usb/cloud.bundle`` or a path ending in ``.bundle``) stays a path, the only
    way git reads one. A form git would misread is said to ``p`` (``url`` comes back as it is)."""
    what = "--remote" if flag else name_of(at)
    if url.startswith("bundle://"):
        return os.path.abspath(url.removeprefix("bundle://"))
    short = _SHORT.match(url)
    if short and (short[2] == "//" or _scheme_like(short[1])):
        p.add(at, f"{what}: {short[0]!r} is a scheme short of a slash: a URL's scheme takes '://' (give {FORMS})",
              flag=flag)
        return url
    if "://" in url:
        _check_url(url, p, at, what, flag)
        return url
    if url.startswith("git@") or ":" in url.split("/")[0]:
        return url
    if url.endswith(".bundle"):
        return os.path.abspath(url)
    return "file://" + os.path.abspath(url)


def _scheme_like(word: str) -> bool:
    """``https``, or a typo of a scheme (``htps``): not a host named like one with a digit or dot
    (``git1``, ``git.example.org``), which ``host:/path`` (ssh, as scp spells it) may name."""
    word = word.lower()
    return word in (*SCHEMES, "bundle") or (re.fullmatch(r"[a-z+]+", word) is not None and bool(
        difflib.get_close_matches(word, (*SCHEMES, "bundle"), n=1, cutoff=0.8)))


def _check_url(url: str, p: Problems, at: At, what: str, flag: bool) -> None:
    """A URL of a scheme git fetches from, with a host (file://: none, an absolute path)."""
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme not in SCHEMES:  # named by its scheme only: the rest may hold a password
        p.add(at, f"{what}: git cannot fetch from {scheme + '://'!r} URLs (give {FORMS})", flag=flag)
        return
    host = rest.split("/", 1)[0].rpartition("@")[2]
    name = host[1:host.find("]")] if host.startswith("[") else host.partition(":")[0]
    if scheme == "file" and host not in ("", "localhost"):
        p.add(at, f"{what}: a file:// URL names no host, it takes an absolute path: three slashes, "
              "file:///path", flag=flag)
    elif scheme != "file" and not name:
        p.add(at, f"{what}: a {scheme}:// URL names no host (give {FORMS})", flag=flag)


def _probe(item: dict[str, Any], i: int, role: str, p: Problems) -> tuple[str | None, float]:
    probe = item.get("probe")
    if probe is None:
        if "check_every" in item:
            p.add(("remotes", i, "check_every"), f"remotes[{i}]: check_every without a probe")
        return None, RemoteConfig.check_every
    parts = urlsplit(str(probe))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        p.add(("remotes", i, "probe"), f"remotes[{i}]: probe is not an http:// or https:// URL")
    if role == "write":
        p.add(("remotes", i, "probe"), f"remotes[{i}]: a probe is for a remote that is read (role: read or both)")
    every = number(item.get("check_every", RemoteConfig.check_every), ("remotes", i, "check_every"), p, most=WEEK)
    return str(probe), every


def remotes(value: Any, p: Problems) -> tuple[RemoteConfig, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        p.add(("remotes",), "remotes: a list of {url, role} (role: read, write or both)")
        return ()
    out = []
    for i, item in enumerate(value):
        item = {"url": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or not item.get("url"):
            p.add(("remotes", i), f"remotes[{i}]: a URL, or a mapping of url, role, probe and check_every")
            continue
        role = str(item.get("role", "both"))
        if role not in ROLES:
            p.add(("remotes", i, "role"), f"remotes[{i}].role: {role!r} is not one of {', '.join(ROLES)}"
                  f"{near(role, ROLES)}")
        url = remote_url(str(item["url"]), p, ("remotes", i, "url"))
        if role != "read" and not ("://" in url or ":" in url.split("/")[0]):
            p.add(("remotes", i, "role"), f"remotes[{i}]: a git bundle can only be read (role: read)")
        probe, check_every = _probe(item, i, role, p)
        out.append(RemoteConfig(url, role, probe, check_every))
    if out and not any(r.reads for r in out):
        p.add(("remotes",), "remotes: none can be read (give one a role of read or both)")
    return tuple(out)
