#!/bin/sh
# Put the reconciler agent on a Debian node (docs/node-install.md). Run as root:
#
#   contrib/install.sh --wheels DIR     # offline: the agent and its dependencies from DIR's wheels
#   contrib/install.sh PACKAGE          # anything pip installs (a wheel, a checkout, reconciler-gitops==0.1.0)
#   contrib/install.sh                  # the checkout this script sits in (dependencies from PyPI)
#   ... --host-driver                   # also the drop-in the host driver needs (contrib/host-driver.conf)
#
# What goes where:
#   /opt/reconciler/                    a venv with the agent; /usr/local/bin/reconciler links to it
#   /etc/reconciler/agent.yaml          the settings: a skeleton the first time, never overwritten
#   /etc/reconciler/trust/              the trust root (allowed_signers, ...): yours to fill
#   /var/lib/reconciler/                the state dir (0711)
#   /etc/systemd/system/reconciler-agent.service (+ .d/host-driver.conf): enabled, not started
#     the first time; on a re-run (an upgrade) replaced, and restarted when it was running
#     (stopped while the code is replaced)
# Missing python3-venv, git or ca-certificates are installed with apt-get.
set -eu

VENV=/opt/reconciler
ETC=/etc/reconciler
STATE=/var/lib/reconciler
UNIT=reconciler-agent.service
UNIT_DIR=/etc/systemd/system
here=$(cd "$(dirname "$0")" && pwd)

say() { echo "install.sh: $*" >&2; }
die() { say "error: $*"; exit 2; }

wheels="" package="" host_driver=""
while [ $# -gt 0 ]; do
    case $1 in
        --wheels) [ $# -ge 2 ] || die "--wheels needs a directory"; wheels=$2; shift 2 ;;
        --host-driver) host_driver=1; shift ;;
        -h | --help) sed -n '2,18s/^# \{0,1\}//p' "$0"; exit 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) [ -z "$package" ] || die "one package at most (got $package and $1)"; package=$1; shift ;;
    esac
done
[ "$(id -u)" = 0 ] || die "run as root (it writes /opt, /etc and /var/lib)"
if [ -n "$wheels" ]; then
    [ -z "$package" ] || die "give --wheels DIR or a PACKAGE, not both"
    [ -d "$wheels" ] || die "--wheels $wheels: no such directory"
    wheels=$(cd "$wheels" && pwd)
elif [ -z "$package" ]; then
    [ -f "$here/../pyproject.toml" ] || die "no PACKAGE given and $here/.. is not a checkout of reconciler"
    package=$(cd "$here/.." && pwd)
fi
for f in "$UNIT" agent.yaml host-driver.conf; do
    [ -f "$here/$f" ] || die "$here/$f is missing: run the install.sh of a whole contrib/ directory"
done

# --- 1. what the agent needs from the system ------------------------------------------------
need=""
command -v python3 >/dev/null || need="$need python3"
python3 -c 'import venv, ensurepip' 2>/dev/null || need="$need python3-venv"
command -v git >/dev/null || need="$need git"
[ -s /etc/ssl/certs/ca-certificates.crt ] || need="$need ca-certificates"
if [ -n "$need" ]; then
    command -v apt-get >/dev/null || die "missing:$need (no apt-get here: install them, then run me again)"
    say "apt-get install$need ..."
    export DEBIAN_FRONTEND=noninteractive
    log=$(mktemp)
    # shellcheck disable=SC2086 # one word per package
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends $need; } >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        rm -f "$log"
        die "apt-get install$need failed (its last lines above)"
    fi
    rm -f "$log"
fi
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "the agent needs Python >= 3.11; python3 here is $(python3 --version 2>&1)"

# --- 2. the agent, in its own venv ----------------------------------------------------------
# A running agent is stopped while its code is replaced: pip removes the old files before it
# writes the new ones, and an agent that imports or re-executes itself in between dies half-way
# through a pass (systemd's auto-restart then finds no unit to restart it as "running"). Its
# services keep running (KillMode=process); whatever ends the script starts it again.
running=""
if [ -d /run/systemd/system ]; then
    case $(systemctl is-active "$UNIT" 2>/dev/null || true) in
        active | activating | reloading) running=1 ;;
    esac
fi
if [ -n "$running" ]; then
    say "stopping $UNIT while its code is replaced (its services keep running) ..."
    systemctl stop "$UNIT"
    trap 'systemctl start "$UNIT" && say "$UNIT started again"' EXIT
fi
if ! "$VENV/bin/python" -c '' 2>/dev/null; then # absent, or left behind by a removed python3
    say "creating the venv $VENV ..."
    python3 -m venv --clear "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check --no-input -q "$@"; }
if [ -n "$wheels" ]; then
    set -- --no-index --find-links "$wheels" reconciler-gitops
else
    set -- "$package"
fi
# The agent was once packaged as "reconciler": that distribution would keep owning the import
# package under the new one (the venv is the agent's own: nothing else installs there).
if "$VENV/bin/python" -m pip show -q reconciler >/dev/null 2>&1; then
    say "removing the agent's old distribution \"reconciler\" (now reconciler-gitops) ..."
    pip uninstall -y reconciler
fi
say "installing $* into $VENV ..."
pip install --upgrade "$@" # dependencies: upgraded only where the new version needs it
# The same version number may carry new code (a checkout, a rebuilt wheel): replace the agent itself.
pip install --force-reinstall --no-deps "$@"
ln -sfn "$VENV/bin/reconciler" /usr/local/bin/reconciler
# An agent that does not even start stops the script here, before /etc or the unit is touched.
version=$("$VENV/bin/reconciler" --version)

# --- 3. settings, trust root, state ---------------------------------------------------------
install -d -m 0755 "$ETC" "$ETC/trust"
if [ -e "$ETC/agent.yaml" ]; then
    say "$ETC/agent.yaml exists: left as it is"
else
    install -m 0600 "$here/agent.yaml" "$ETC/agent.yaml"
    say "wrote the skeleton $ETC/agent.yaml"
fi
install -d -m 0711 "$STATE"

# --- 4. the unit ----------------------------------------------------------------------------
install -m 0644 "$here/$UNIT" "$UNIT_DIR/$UNIT"
dropin=$UNIT_DIR/$UNIT.d/host-driver.conf
if [ -n "$host_driver" ] || [ -e "$dropin" ]; then # an upgrade keeps the choice made before
    install -d -m 0755 "$UNIT_DIR/$UNIT.d"
    install -m 0644 "$here/host-driver.conf" "$dropin"
fi
if [ ! -d /run/systemd/system ]; then
    say "$version installed; systemd is not running here: start $UNIT yourself where it is"
    exit 0
fi
systemctl daemon-reload
systemctl enable --quiet "$UNIT"
if [ -n "$running" ]; then
    trap - EXIT
    systemctl start "$UNIT"
    say "$version installed; $UNIT restarted"
else
    say "$version installed; next: set node and remote in $ETC/agent.yaml, the trust root in $ETC/trust/,"
    say "then: systemctl start ${UNIT%.service}"
fi
