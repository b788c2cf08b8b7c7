#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Make sure gitolite3 and sshd are installed, for tests/gitolite_fixtures.py (tests and CI). Idempotent.
#
#   scripts/gitolite-server.sh        # as root; progress and timings on stderr; does nothing when both exist
#
# Installs the Debian packages gitolite3 and openssh-server with apt when `gitolite` or sshd is missing.
# gitolite3's debconf asks for an admin key and would set up a system-wide `gitolite3` user with it:
# the questions are preseeded empty first (no key: the package configures no instance), so the
# install never prompts. Nothing else is created: the fixture makes its own unix user, gitolite
# instance and sshd per test.

_reconciler_gitolite_server() (
    set -euo pipefail
    exec 1>&2

    local t_all
    t_all=$(date +%s%N)
    local RECONCILER_SCRIPT=gitolite-server
    # shellcheck source=lib.sh
    . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
    has_gitolite() { command -v gitolite >/dev/null 2>&1 || [ -x /usr/share/gitolite3/gitolite ]; }
    has_sshd() { command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; }

    local pkgs=()
    has_gitolite || pkgs+=(gitolite3)
    has_sshd || pkgs+=(openssh-server)
    if [ ${#pkgs[@]} -eq 0 ]; then
        say "gitolite and sshd already installed; nothing to do"
        return 0
    fi
    need_root "installing ${pkgs[*]}"

    export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1
    if [[ " ${pkgs[*]} " == *" gitolite3 "* ]]; then
        command -v debconf-set-selections >/dev/null || { say "error: debconf-set-selections missing"; exit 1; }
        say "preseeding gitolite3 debconf: empty admin key (no system-wide instance)"
        debconf-set-selections <<'EOF'
gitolite3 gitolite3/adminkey string
gitolite3 gitolite3/gituser string gitolite3
gitolite3 gitolite3/gitdir string /var/lib/gitolite3
EOF
    fi
    local t
    t=$(date +%s%N)
    say "apt-get update ..."
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    say "apt-get install ${pkgs[*]} ..."
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${pkgs[@]}"
    say "apt-get install ${pkgs[*]}: $(since "$t")"

    has_gitolite || { say "error: gitolite still missing after install"; exit 1; }
    has_sshd || { say "error: sshd still missing after install"; exit 1; }
    say "done in $(since "$t_all")"
)

_reconciler_gitolite_server "$@"
