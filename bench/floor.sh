#!/usr/bin/env bash
# Issue 40's table of the no-op paths and of one template change (bench/change.py) from a fresh
# clone, each figure beside its peer in the same run: .venv made as test.sh makes it, the
# checkout pip-installed into a venv of its own and ansible-core into another (both from the
# package index, cached: bench/peers.py), then the runs.
#   bench/floor.sh [--runs 9] [--batch 10] [--idle 5]
set -euo pipefail
cd "$(dirname "$0")/.."
. ./scripts/ensure-venv.sh
exec .venv/bin/python bench/poll.py --targets "$@"
