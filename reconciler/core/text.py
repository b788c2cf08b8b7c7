"""Text from elsewhere (a note, a repo, a service's output) made safe to show on a terminal.

A terminal obeys what it is sent: an escape sequence in a note's error can clear the screen,
move the cursor over the line above or set the window title, and a bidi override can show a
line in another order than it reads; so a failure could be hidden from the operator looking
at it. ``printable`` keeps the visible text and drops the rest; every table and line the
command line prints from such text goes through it (markup escaping is the printer's).
"""

from __future__ import annotations

import re

__all__ = ["cut", "printable"]

# Whole escape sequences first, so their parameters do not stay behind as text: CSI
# (ESC [ ... final byte), OSC/DCS/SOS/PM/APC strings (to BEL or ST), and any other ESC + byte.
_SEQUENCES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI
    r"|\x9b[0-?]*[ -/]*[@-~]?"  # the 8-bit CSI
    r"|[\x1b][\]PX^_].*?(?:\x07|\x1b\\|\x9c|$)"  # OSC, DCS, SOS, PM, APC up to their end
    r"|[\x90\x9d\x98\x9e\x9f].*?(?:\x07|\x1b\\|\x9c|$)"  # their 8-bit forms
    r"|\x1b.?",  # ESC and the one character it introduces
    re.DOTALL,
)
# What separates words: shown as one space, so "did not\nstart" reads "did not start".
_SPACES = re.compile(r"[\t\n\r\v\f\u0085\u2028\u2029]+")
# Everything else a terminal acts on or reorders by: C0, DEL, C1, the bidi embeddings,
# overrides and isolates, and lone surrogates (no terminal encoding can carry them).
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with escape sequences and control characters removed, whitespace runs as one
    space; longer than ``limit`` characters: cut there and marked (``cut``)."""
    if limit is None:
        return _clean(text)
    # Cleaned from a bounded head only: a 20 MB text costs what its first pages do.
    head = text[: limit * 8 + 64]
    clean = _clean(head)
    if len(clean) <= limit and len(head) == len(text):
        return clean
    return f"{clean[:limit]}… [cut, {_size(text)} bytes]"


def _clean(text: str) -> str:
    return _CONTROLS.sub("", _SPACES.sub(" ", _SEQUENCES.sub("", text)))


def cut(text: str, limit: int | None, whole: int | None = None) -> str:
    """``text`` at most ``limit`` characters (plus the mark): the rest replaced by
    "… [cut, N bytes]", N the size of the whole (``whole`` when the caller knows it better)."""
    if limit is None or len(text) <= limit:
        return text
    return f"{text[:limit]}… [cut, {whole if whole is not None else _size(text)} bytes]"


def _size(text: str) -> int:
    return len(text.encode("utf-8", "replace"))
