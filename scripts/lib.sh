# shellcheck shell=bash
# The prelude shared by scripts/docker-engine.sh, systemd-image.sh and gitolite-server.sh. Not run
# on its own: each script sources it at the top of its subshell function, after `set -euo pipefail`,
# so the helpers never leak into a shell that sources docker-engine.sh:
#
#   local RECONCILER_SCRIPT=docker-engine # the `say` prefix (default: the sourcing file, less .sh)
#   # shellcheck source=lib.sh
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Defines say, since, answers, have_image, need_root and apt_install. Defines no variables but
# _reconciler_prefix, and runs nothing else.

_reconciler_prefix=${RECONCILER_SCRIPT:-$(basename "${BASH_SOURCE[1]:-$0}" .sh)}

say() { echo "$_reconciler_prefix: $*" >&2; }
since() { # milliseconds since $1 (date +%s%N) as seconds with one decimal
    local ms=$((($(date +%s%N) - $1) / 1000000))
    printf '%d.%ds' $((ms / 1000)) $((ms % 1000 / 100))
}
answers() { timeout 15 docker -H "$1" info >/dev/null 2>&1; }     # answers HOST: an engine answers there
have_image() { docker image inspect "$1" >/dev/null 2>&1; }       # have_image NAME: on $DOCKER_HOST
need_root() { # need_root WHAT: exit 1 with "error: WHAT needs root ..." unless root
    [ "$(id -u)" = 0 ] || { say "error: $1 needs root (run this script as root once)"; exit 1; }
}
apt_install() { # apt_install PKG...: apt-get update + install, waiting for a concurrent apt
    need_root "apt-get install $*"
    local t
    t=$(date +%s%N)
    say "apt-get install $* ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$@" >&2
    say "apt-get install $*: $(since "$t")"
}
