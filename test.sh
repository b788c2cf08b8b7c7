#!/usr/bin/env bash
# Run the test suite: installs what it needs into .venv first (Python >= 3.11, git).
#   ./test.sh                 everything (lint, types, tests)
#   ./test.sh -k planner      pytest arguments pass through
set -euo pipefail
cd "$(dirname "$0")"
. ./scripts/ensure-venv.sh
.venv/bin/ruff check reconciler tests bench examples
.venv/bin/mypy reconciler
exec .venv/bin/pytest "$@"
