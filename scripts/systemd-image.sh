#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Make sure the image reconciler-test/systemd:1 exists: Debian bookworm with a real systemd as PID 1
# (tests/systemd_fixtures.py runs it; nothing is pulled). Idempotent: does nothing when it exists.
#
#   scripts/systemd-image.sh          # progress and timings on stderr; last stdout line: export DOCKER_HOST=...
#
# 1. The engine: the one answering on $DOCKER_HOST (or the default socket), else scripts/docker-engine.sh
#    is sourced with RECONCILER_SKIP_IMAGES=1 (starts or reuses the private engine).
# 2. The rootfs: debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,python3,procps bookworm
#    (procps for /bin/kill, as in the usual `ExecReload=/bin/kill -HUP $MAINPID`, and ps/pgrep), cached
#    as a tarball in /var/cache/reconciler-images/ named after the package list (debootstrap, apt and
#    root only the first time).
# 3. The image: the cached rootfs plus container tweaks (see configure_rootfs), docker import'ed with
#    CMD /lib/systemd/systemd and ENV container=docker, then booted once as a check (`systemctl
#    is-system-running` must say running). docker import takes no STOPSIGNAL, so `docker stop` waits
#    10 s and then kills: remove these containers with `docker rm -f`.
# Run it with:
#   docker run -d --cap-add SYS_ADMIN --security-opt seccomp=unconfined --tmpfs /run --tmpfs /run/lock \
#     -v /sys/fs/cgroup:/sys/fs/cgroup:ro reconciler-test/systemd:1
# Set RECONCILER_DEBIAN_MIRROR to use another mirror.

_reconciler_systemd_image() (
    set -euo pipefail
    exec 3>&1 1>&2 # stdout is only for the final export line

    local image=reconciler-test/systemd:1
    local cache=/var/cache/reconciler-images
    local mirror=${RECONCILER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
    local suite=bookworm
    local include=systemd,systemd-sysv,dbus,python3,procps
    local here t_all t
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    t_all=$(date +%s%N)

    local RECONCILER_SCRIPT=systemd-image
    # shellcheck source=lib.sh
    . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

    # --- 1. the engine -------------------------------------------------------------------------
    t=$(date +%s%N)
    local host=""
    if command -v docker >/dev/null; then
        if [ -n "${DOCKER_HOST:-}" ] && answers "$DOCKER_HOST"; then
            host=$DOCKER_HOST
        elif [ -z "${DOCKER_HOST:-}" ] && answers unix:///var/run/docker.sock; then
            host=unix:///var/run/docker.sock
        fi
    fi
    if [ -z "$host" ]; then
        say "no engine answers on ${DOCKER_HOST:-the default socket}; scripts/docker-engine.sh ..."
        # shellcheck source=/dev/null # its helpers and locals live in its own subshell
        RECONCILER_SKIP_IMAGES=1 . "$here/docker-engine.sh" 3>&- # exports DOCKER_HOST
        host=$DOCKER_HOST
    fi
    export DOCKER_HOST=$host
    say "engine answers on $host ($(since "$t"))"

    if have_image "$image"; then
        say "image $image present ($(since "$t_all"))"
        echo "export DOCKER_HOST=$host" >&3
        return 0
    fi
    exec 8>>"${TMPDIR:-/tmp}/reconciler-systemd-image.$(id -u).lock"
    flock 8 # one builder at a time (parallel test sessions)
    if have_image "$image"; then
        say "image $image present (built meanwhile by another process; $(since "$t_all"))"
        echo "export DOCKER_HOST=$host" >&3
        return 0
    fi
    local tmp
    tmp=$(mktemp -d /tmp/reconciler-systemd-image.XXXXXX)
    trap 'rm -rf "$tmp"; [ -z "${check:-}" ] || docker rm -f "$check" >/dev/null 2>&1 || true' EXIT

    # --- 2. the rootfs (cached) ------------------------------------------------------------------
    local tarball
    tarball=$cache/systemd-$suite-minbase-$(printf '%s' "$include" | sha256sum | cut -c1-8).tar
    if [ ! -s "$tarball" ]; then
        t=$(date +%s%N)
        need_root "debootstrap (building $image)"
        command -v debootstrap >/dev/null || apt_install debootstrap
        mkdir -p "$cache"
        local root=$tmp/systemd-root
        say "debootstrap $suite minbase + $include into $root ..."
        if ! debootstrap --variant=minbase --include="$include" \
            "$suite" "$root" "$mirror" >"$tmp/debootstrap.log" 2>&1; then
            tail -n 30 "$tmp/debootstrap.log" >&2
            say "error: debootstrap failed (last 30 lines of its log above)"
            exit 1
        fi
        say "debootstrap: $(since "$t")"
        # Smaller tarball: no package caches, docs or manuals.
        rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
            "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
            "$root"/var/log/*.log "$root"/debootstrap
        tar --numeric-owner -C "$root" -cf "$tarball.tmp" .
        mv "$tarball.tmp" "$tarball"
        rm -rf "$root"
        say "rootfs cached as $tarball ($(du -h "$tarball" | cut -f1)): $(since "$t")"
    else
        say "using cached rootfs $tarball"
    fi

    # --- 3. container tweaks, import, boot check -------------------------------------------------
    t=$(date +%s%N)
    local root=$tmp/rootfs
    mkdir -p "$root"
    tar --numeric-owner -C "$root" -xf "$tarball"
    configure_rootfs "$root"
    tar --numeric-owner -C "$root" -c . |
        docker import -c 'CMD ["/lib/systemd/systemd"]' -c 'ENV container=docker' -c 'ENV LANG=C.UTF-8' \
            - "$image" >/dev/null
    rm -rf "$root"
    say "docker import $image: $(since "$t")"

    t=$(date +%s%N)
    check=reconciler-systemd-check-$$
    docker run -d --name "$check" --label reconciler.test-run=systemd-image-check \
        --cap-add SYS_ADMIN --security-opt seccomp=unconfined --tmpfs /run --tmpfs /run/lock \
        -v /sys/fs/cgroup:/sys/fs/cgroup:ro "$image" >/dev/null
    local state="" i
    for ((i = 0; i < 120; i++)); do
        state=$(docker exec "$check" systemctl is-system-running 2>/dev/null || true)
        case $state in running | degraded) break ;; esac
        sleep 0.5
    done
    if [ "$state" != running ]; then
        say "error: systemd in $image did not reach 'running' within 60 s (state: '${state:-no answer}')"
        docker exec "$check" systemctl --failed --no-pager >&2 || true
        docker logs --tail 40 "$check" >&2 || true
        docker rmi "$image" >/dev/null 2>&1 || true
        exit 1
    fi
    docker rm -f "$check" >/dev/null
    check=""
    say "booted $image once: systemd $state in $(since "$t")"
    say "built $image ($(since "$t_all"))"
    echo "export DOCKER_HOST=$host" >&3
)

configure_rootfs() { # configure_rootfs ROOT: tweaks for a test container
    # The stock bookworm minbase already boots to "running" with the flags above (no udev installed,
    # getty@tty1 skipped for lack of /dev/tty0), so nothing needs masking. Only drop what Debian enables
    # in /etc/systemd/system: apt-daily/fstrim/e2scrub/dpkg-db-backup timers, getty@tty1, pstore. Tests
    # bind-mount an empty directory over /etc/systemd/system anyway; this makes the image boot the same
    # way without that mount.
    local root=$1
    rm -rf "$root"/etc/systemd/system/timers.target.wants "$root"/etc/systemd/system/getty.target.wants \
        "$root"/etc/systemd/system/sysinit.target.wants/systemd-pstore.service \
        "$root"/etc/systemd/system/multi-user.target.wants/e2scrub_reap.service
    # A fresh machine id at every boot (systemd makes a transient one when the file is empty).
    : >"$root"/etc/machine-id
}

_reconciler_systemd_image "$@"
