#!/usr/bin/env bash
# The demo: five nodes of a small cloud converge on a git remote, then one template changes.
#   ./demo.sh            runs it in a temporary folder and stops every service at the end
#   ./demo.sh --keep     leaves the services running and prints where
set -euo pipefail
cd "$(dirname "$0")"
. ./scripts/ensure-venv.sh
exec .venv/bin/python examples/demo.py "$@"
