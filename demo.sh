#!/usr/bin/env bash
# The demo: five nodes of a small cloud converge on a git remote, then one template changes.
#   ./demo.sh            runs it in a temporary folder and stops every service at the end
#   ./demo.sh --keep     leaves the services running and prints where
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
