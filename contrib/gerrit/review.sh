#!/usr/bin/env bash
# For a Jenkins job fired by the Gerrit Trigger plugin, run in a checkout of the patch set:
# posts `reconciler diff` on the change, Verified -1 when it does not validate.
# Needs GERRIT_URL, GERRIT_USER, GERRIT_PASSWORD (credentials binding); the plugin sets
# GERRIT_CHANGE_NUMBER and GERRIT_PATCHSET_REVISION. Exit 1 when the change does not validate.
set -euo pipefail
: "${GERRIT_URL:?}" "${GERRIT_USER:?}" "${GERRIT_PASSWORD:?}" "${GERRIT_CHANGE_NUMBER:?}" "${GERRIT_PATCHSET_REVISION:?}"
base=$(git rev-parse "${GERRIT_PATCHSET_REVISION}~1")
args=()
[ -n "${BUILD_URL:-}" ] && args+=(--artifact-url "${BUILD_URL}artifact/reconciler-diff.md")
reconciler review-post --forge gerrit --repo . --report-file reconciler-diff.md "${args[@]}" \
    "$base" "$GERRIT_PATCHSET_REVISION"
