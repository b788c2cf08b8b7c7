"""The daemon as the console script starts it, plus a SIGUSR2 handler that writes the names of
its modules to a file (the script's first argument): what an idle agent holds, from the agent
itself. Shared by tests/test_idle.py and bench/poll.py."""

DAEMON = """
import os, signal, sys
out = sys.argv.pop(1)
def listed(*_):
    with open(out + ".part", "w") as f:
        f.write("\\n".join(sys.modules))
    os.replace(out + ".part", out)
signal.signal(signal.SIGUSR2, listed)
sys.argv[0] = "reconciler"
from reconciler.entry import main
main()
"""
