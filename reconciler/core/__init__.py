"""What every layer of the agent stands on: the data passed between stages (``model``), the
errors and their reason codes (``errors``), render limits, fault points, atomic writes, memo
tables and the redaction of secret values from captured output (``redact``).

Not a face: each module is imported by its own name, so that importing one (``core.memo``
from the bottom layer) never loads the others.
"""
