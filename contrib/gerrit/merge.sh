#!/usr/bin/env bash
# For a Jenkins job fired by the Gerrit Trigger plugin on an approval (comment-added, Code-Review
# +2), run in a clone of the deployment repo: merges the change as a commit signed by the merge
# key, the one the nodes trust, pushes it to the nodes' git server, then to Gerrit's branch so
# Gerrit shows the change merged (docs/operations/signed-merges.md). Gerrit's own submit stays off
# for the branch: it would not sign.
# Needs GERRIT_URL, GERRIT_USER, GERRIT_PASSWORD (credentials binding), NODES_GIT (the nodes' git
# server), MERGE_KEY_FILE, MERGE_EMAIL (its principal in trust/allowed_signers); the plugin sets
# GERRIT_CHANGE_NUMBER and GERRIT_BRANCH. GERRIT_GIT: Gerrit's git URL [the clone's origin].
# A change not (yet) approved is no failure: said, nothing merged, exit 0.
set -euo pipefail
: "${GERRIT_URL:?}" "${GERRIT_USER:?}" "${GERRIT_PASSWORD:?}" "${GERRIT_CHANGE_NUMBER:?}" "${NODES_GIT:?}"
: "${MERGE_KEY_FILE:?}" "${MERGE_EMAIL:?}"
gerrit_git=${GERRIT_GIT:-origin}
rc=0
reconciler merge --forge gerrit --change "$GERRIT_CHANGE_NUMBER" --branch "${GERRIT_BRANCH:-main}" --repo . \
    --remote "$NODES_GIT" --forge-git "$gerrit_git" --also-push "$gerrit_git" \
    --signing-key "$MERGE_KEY_FILE" --name "${MERGE_NAME:-reconciler merge bot}" --email "$MERGE_EMAIL" \
    --policy "${TRUST_POLICY:-first-parent}" || rc=$?
if [ "$rc" -eq 3 ]; then
    echo "change $GERRIT_CHANGE_NUMBER is not approved for merge yet: nothing merged"
    exit 0
fi
exit "$rc"
