"""A cheap tip probe: one small file over HTTP that says where the branches are, so a no-op
poll costs the git server a static file read and no git process at all.

The file is written on the server by ``contrib/post-receive-tips`` (``<sha> TAB refs/heads/X``
per branch, as ``git ls-remote`` prints them) and served by any static web server. At 1000
nodes polling every 10 s, the server forks no upload-pack for a poll that finds nothing new.

The probe is a hint, never an authority. Its answer is used for one thing only: to skip the git
ref check when it names the head the node already has. Anything else (it names another commit,
it does not answer, it cannot be read) sends the poll to git, which is the authority, and a
commit fetched is verified exactly as before. What a probe can do wrong is say "nothing moved"
when something did: a real git ref check at least every ``check_every`` seconds bounds that,
and a probe caught saying an old head is not believed again until it agrees with git.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from reconciler.source.refs import NOTES_PREFIX

log = logging.getLogger("reconciler.probe")

TIMEOUT = 10.0
MAX_BYTES = 64 * 1024  # a tips file lists branches; one this big is not one
# A notes file is a hundred bytes on the same web server, read by a waiting node every second:
# one that does not come at once is not waited for long, and a probe that did not answer is
# asked again only after a back-off (git reads the notes meanwhile).
NOTES_TIMEOUT = 2.0
NOTES_BACKOFF_MAX = 60.0


class ProbeFailed(Exception):
    """The probe could not say (no answer, an HTTP error, a file that is not a tips file)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status, when the server answered one


def read_tips(url: str, timeout: float = TIMEOUT) -> dict[str, str]:
    """GET the tips file at ``url``: ref name -> commit id."""
    import http.client  # only where a probe is configured: the idle agent without one stays lighter

    parts = urlsplit(url)
    conn_type = {"http": http.client.HTTPConnection, "https": http.client.HTTPSConnection}.get(parts.scheme)
    if conn_type is None or not parts.hostname:
        raise ProbeFailed(f"not an http(s) URL: {parts.scheme}://")
    headers = {"Cache-Control": "no-cache", "User-Agent": "reconciler-probe"}
    if parts.username is not None:
        user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(user.encode()).decode()
    conn = conn_type(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers=headers)
        resp = conn.getresponse()
        body = resp.read(MAX_BYTES + 1)
        if resp.status != 200:
            raise ProbeFailed(f"HTTP {resp.status} {resp.reason}", resp.status)
    except (OSError, http.client.HTTPException) as exc:
        raise ProbeFailed(str(exc) or type(exc).__name__) from None
    finally:
        conn.close()
    if len(body) > MAX_BYTES:
        raise ProbeFailed(f"over {MAX_BYTES} bytes: not a tips file")
    return parse_tips(body)


def parse_tips(body: bytes) -> dict[str, str]:
    tips: dict[str, str] = {}
    for n, line in enumerate(body.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():
            continue
        oid, sep, ref = line.partition("\t")
        if not sep or len(oid) not in (40, 64) or not _is_hex(oid) or not ref.startswith("refs/"):
            raise ProbeFailed(f"line {n} is not '<commit id> TAB refs/...'")
        tips[ref.strip()] = oid
    return tips


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


@dataclass
class TipProbe:
    """The probe of one read remote, with what it said this poll and when git last answered."""

    url: str
    check_every: float
    """Seconds: git is asked at least this often, whatever the probe says."""
    shown: str = ""
    """The URL as messages show it (no credentials)."""
    clock: Callable[[], float] = time.monotonic
    _checked: float | None = field(default=None, init=False)  # when git last answered for this remote
    _said: str | None = field(default=None, init=False)  # the head the probe named this poll
    _doubted: bool = field(default=False, init=False)  # caught naming an old head: git until it agrees
    _down: bool = field(default=False, init=False)  # its failure was logged: once per outage
    _notes_failed: int = field(default=0, init=False)  # notes reads failed in a row: the back-off's exponent
    _notes_retry: float = field(default=0.0, init=False)  # not asked for notes tips again before this

    def unmoved(self, ref: str, local: str | None) -> bool:
        """May this poll skip git? Only when the probe, believed, names ``local`` as the head of
        ``ref``, and git answered less than ``check_every`` seconds ago. The probe is asked even
        when git will be (a check is due, it is doubted), so ``checked`` can hold it to git's word."""
        self._said = None
        if local is None or self._checked is None:
            return False
        self._said = self.ask(ref)
        return (self._said == local and not self._doubted
                and self.clock() - self._checked < self.check_every)

    def ask(self, ref: str) -> str | None:
        """The head the probe names for ``ref``; None when it cannot say (logged once an outage)."""
        try:
            tips = read_tips(self.url)
        except ProbeFailed as exc:
            if not self._down:
                log.warning("tip probe %s failed (%s): polling with git until it answers", self.shown, exc)
                self._down = True
            return None
        if self._down:
            log.info("tip probe %s answers again", self.shown)
            self._down = False
        return tips.get(ref)

    def note_tip(self, node: str) -> str | None:
        """The tip of ``node``'s notes ref as the hook published it beside the tips file
        (``<file>.notes/<node>``); None when it cannot say (no hook for notes, a node that noted
        nothing, no answer). Only a hint, as the tips file: a waiting node uses it to skip the
        git read of its sentinel when that names the note it already has (``node.peers``), and reads
        the batch before whole with git every 300 s however still the hint."""
        try:
            return self.notes_tip(node)
        except ProbeFailed as exc:
            log.debug("notes tip of %s from %s: %s", node, self.shown, exc)
            return None

    def notes_tip(self, node: str) -> str | None:
        """``note_tip``, which tells a node with no notes ref (no file: None) from a probe that
        cannot say (``ProbeFailed``): a waiting node's wait-poll (``node.waitpoll.notes_moved``).
        After a failure, not asked again for a back-off (2 s, doubling up to a minute)."""
        now = self.clock()
        if self._notes_failed and now < self._notes_retry:
            raise ProbeFailed(f"no answer before: asked again in {self._notes_retry - now:.0f}s")
        parts = urlsplit(self.url)
        url = urlunsplit(parts._replace(path=f"{parts.path}.notes/{quote(node, safe='')}"))
        try:
            tip = read_tips(url, NOTES_TIMEOUT).get(NOTES_PREFIX + node)
        except ProbeFailed as exc:
            if exc.status != 404:  # 404: a node that noted nothing, from a probe that answers
                if not self._notes_failed:
                    log.warning("tip probe %s: no notes tips (%s): asking git until it answers", self.shown, exc)
                self._notes_failed += 1
                self._notes_retry = now + min(NOTES_BACKOFF_MAX, 2.0**self._notes_failed)
                raise
            tip = None
        if self._notes_failed:
            log.info("tip probe %s: notes tips answered again", self.shown)
            self._notes_failed = 0
        return tip

    def checked(self, ref: str, head: str, local: str | None) -> None:
        """Git answered ``head`` for ``ref``. A probe that named the node's own head while git has
        another is stale (its hook does not run, or a push came between the two reads): doubted,
        and git asked on every poll, until it names git's head again."""
        self._checked = self.clock()
        said, self._said = self._said, None
        if said is None:
            return
        if self._doubted:
            if said == head:
                log.info("tip probe %s agrees with git again", self.shown)
                self._doubted = False
        elif said == local and head != local:
            log.warning("tip probe %s is stale: it names %s for %s, git has %s (is its hook installed?); "
                        "polling with git until it agrees", self.shown, said[:12], ref, head[:12])
            self._doubted = True
