#!/usr/bin/env bash
# The demo: five nodes of a small cloud converge on a git remote, then one template changes.
#   ./demo.sh            runs it in a temporary folder; at the end stops every service and
#                        removes the folder (its keys with it), even when a step failed
#   ./demo.sh --keep     leaves the services running and the folder, and prints where
#   ./demo.sh --dir DIR  works in DIR and keeps it (its services stopped)
#   ./demo.sh --driver docker    the same cloud as containers (starts a Docker engine if needed)
set -euo pipefail
cd "$(dirname "$0")"
. ./scripts/ensure-venv.sh
case " $* " in
  *" --driver docker "*|*" --driver=docker "*)
    # A Docker engine and the example image (built locally: no registry is needed).
    eval "$(scripts/docker-engine.sh | tail -1)" ;;
esac
exec .venv/bin/python examples/demo.py "$@"
