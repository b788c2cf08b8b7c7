#!/usr/bin/env bash
# Run the test suite: installs what it needs into .venv first (Python >= 3.11, git).
#   ./test.sh                         everything: installs the system packages the tests use
#                                     (apt-get, as root), then lint, types, and every test
#   ./test.sh tests/test_render.py    with arguments: only pytest with them (a file, -k planner,
#   ./test.sh -k planner              -n 1, ...): no apt-get, no lint, no types; a test whose
#                                     system package is missing fails or skips, and says which
set -euo pipefail
cd "$(dirname "$0")"
. ./scripts/ensure-venv.sh
# Real parts the tests use: ssh-keygen and gpg (signatures), sshd (an ssh:// remote), Chromium
# (the fleet's HTML page, opened headless), the distribution registry and htpasswd (image pulls),
# nginx (the tip probe's web server) and fcgiwrap (git http-backend behind it).
missing=()
command -v ssh-keygen >/dev/null || missing+=(openssh-client)
command -v gpg >/dev/null || missing+=(gnupg)
[ -x /usr/sbin/sshd ] || command -v sshd >/dev/null || missing+=(openssh-server)
command -v chromium >/dev/null || missing+=(chromium)
command -v docker-registry >/dev/null || missing+=(docker-registry)
command -v htpasswd >/dev/null || missing+=(apache2-utils)
[ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || missing+=(nginx-light)
command -v fcgiwrap >/dev/null || [ -x /usr/sbin/fcgiwrap ] || missing+=(fcgiwrap)
if [ $# -gt 0 ]; then
  # A subset: what the user asked for, quickly; the full run is the one that installs and lints.
  [ ${#missing[@]} -eq 0 ] || echo "note: ${missing[*]} not installed (./test.sh without arguments installs them)" >&2
  exec .venv/bin/pytest "$@"
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing ${missing[*]} ..." >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null
  else
    echo "warning: ${missing[*]} missing; tests that need them will fail (CI) or skip" >&2
  fi
fi
.venv/bin/ruff check reconciler tests bench examples
.venv/bin/mypy reconciler
# The benchmarks import the tests' servers (tests/nginx.py, tests/ports.py): checked with them, so a
# change to a helper's signature cannot break a bench that no test runs.
MYPYPATH=tests:bench .venv/bin/mypy bench
# The tests themselves, with their helpers (conftest, ports, the fixture modules) as imports.
MYPYPATH=tests .venv/bin/mypy tests
# The layers of the loop (pyproject.toml [tool.importlinter]): quiet when kept, the report when broken.
layers=$(.venv/bin/lint-imports --no-cache 2>&1) || { echo "$layers" >&2; exit 1; }
exec .venv/bin/pytest "$@"
