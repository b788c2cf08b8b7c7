"""The agent's own log on stderr: text (with timestamps), journal (syslog priority prefixes,
no timestamps: journald adds the time) or json (one object a line), as ``--log-format`` says.
Here, below the command line, so that ``entry`` sets it up for `agent` without click."""

from __future__ import annotations

import logging
import sys


def configure(verbose: int, log_format: str) -> None:
    """The root logger at WARNING (INFO, DEBUG with ``verbose``), one handler on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=logging.WARNING - 10 * verbose, handlers=[handler])


class _JournalFormatter(logging.Formatter):
    """``<priority>message``: journald reads the syslog priority from the prefix and stamps
    the time itself (sd-daemon(3))."""

    PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record).replace("\n", " | ")  # one journal entry per record
        return f"<{self.PRIORITY.get(record.levelno, 6)}>{text}"


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        import json
        from datetime import UTC, datetime

        out = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, sort_keys=True)


def formatter(choice: str) -> logging.Formatter:
    if choice == "auto":
        choice = "journal" if _stderr_is_journal() else "text"
    if choice == "journal":
        return _JournalFormatter("%(levelname)s %(message)s")
    if choice == "json":
        return _JsonFormatter()
    return logging.Formatter("%(asctime)s %(levelname)s %(message)s")


def _stderr_is_journal() -> bool:
    """systemd sets $JOURNAL_STREAM to the device:inode of the journal's socket; stderr is the
    journal when they match (not merely when a child inherited the variable)."""
    import os

    stream = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in stream.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)
