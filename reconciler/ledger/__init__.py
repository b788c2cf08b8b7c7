"""The node's memory: typed tables, named transitions, the only SQL in the project.

This ``__init__`` is the package's face, on purpose: callers import ``Ledger`` and the records it
hands out from ``reconciler.ledger``, never from the modules that hold them (``ledger``, the
object; ``db``, ``commits``, ``services``, ``upgrades``, ``flags``, its parts). ``statedir``
(the state directory around the database) is imported as itself.

One SQLite database per node (``<state>/state.db``, WAL, synchronous=FULL). What it holds:

- the **mark**: the last commit this node acted on (anti-rollback's reference), its signer and
  the origin of the trust root in force;
- per **commit**, the node's verdict (``Verdict``) and the moves allowed between verdicts
  (``ALLOWED``): above all, ``failed`` never becomes ``applied`` unless a run of that same commit
  applied it and found every service healthy (``Proof.HEALTHY_RUN``); a rollback or an unpin adds
  events and pins to a commit's record and never touches its verdict. Each record knows whether
  its note is written, so a run killed between the verdict and the note finishes the note;
- per **service**, the running version (the commit it was rendered from, its hash), the last good
  one, and a history of versions;
- **pins** (to which commit, made at which head, by whom);
- the **converged** marker: the commit and hashes of the last full run that left every service
  healthy, which lets a poll that finds nothing new do nothing; anything that changes what the
  node should run (a pin, an unpin, a retry) clears it;
- the **journal** of actions in flight: written before an action, settled after its effect;
- **upgrades** in progress per commit and service (the version they started from), each
  **step**'s status and times (what barriers on other nodes read from the note), and the
  template variables a pin step **holds** on this node;
- **flags**: suspensions, the post-upgrade steps owed, the notes pushed, the polls counted.

Notes, ``status``, ``history`` and the fleet gate all read these records; ``report`` (a
``model.Report``) is the projection a note is encoded from.
"""

from reconciler.ledger.commits import CommitRecord, IllegalTransition, Mark, Proof
from reconciler.ledger.flags import NotesPushed, Poll
from reconciler.ledger.ledger import Ledger
from reconciler.ledger.services import HistoryRow, Interrupted, Pin, ServiceRecord, Version

__all__ = ["CommitRecord", "HistoryRow", "IllegalTransition", "Interrupted", "Ledger", "Mark", "NotesPushed", "Pin",
           "Poll", "Proof", "ServiceRecord", "Version"]
