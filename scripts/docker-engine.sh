#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Make sure a Docker engine answers and the local test images exist (tests and CI). Idempotent.
#
#   eval "$(scripts/docker-engine.sh | tail -1)"     # executed: last stdout line is `export DOCKER_HOST=...`
#   . scripts/docker-engine.sh                        # sourced: exports DOCKER_HOST in the calling shell
#
# 1. An engine that already answers on $DOCKER_HOST (or the default socket) is used as it is.
#    Otherwise a private one: socket unix:///run/reconciler-test-docker.sock, data root
#    /var/lib/reconciler-test-docker, log /tmp/reconciler-dockerd.log (started once, reused after;
#    installs docker.io with apt when dockerd is missing, which needs root).
# 2. Test images, built only when missing (nothing can be pulled on CI):
#      reconciler-test/busybox:1        Debian's busybox-static and a few applet symlinks
#      reconciler-test/busybox:2        the same plus /etc/image-version = 2 (another image id)
#      reconciler-example/python:3.11   debootstrap'ed bookworm minbase + python3 (3.11, stdlib)
#    The python rootfs is cached as a tarball in /var/cache/reconciler-images/.
# All progress goes to stderr, with timings. Set RECONCILER_SKIP_IMAGES=1 to only start the engine.

_reconciler_docker_engine() (
    set -euo pipefail
    exec 3>&1 1>&2 # stdout is only for the final export line

    local sock=unix:///run/reconciler-test-docker.sock
    local data_root=/var/lib/reconciler-test-docker
    local exec_root=/run/reconciler-test-docker
    local pidfile=/run/reconciler-test-docker.pid
    local log=/tmp/reconciler-dockerd.log
    local cache=/var/cache/reconciler-images
    local mirror=${RECONCILER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
    local suite=bookworm
    local t_all
    t_all=$(date +%s%N)

    local RECONCILER_SCRIPT=docker-engine
    # shellcheck source=lib.sh
    . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

    # --- 1. the engine -------------------------------------------------------------------------
    local host="" t
    t=$(date +%s%N)
    command -v docker >/dev/null || apt_install docker.io
    if [ -n "${DOCKER_HOST:-}" ] && answers "$DOCKER_HOST"; then
        host=$DOCKER_HOST
    elif [ -z "${DOCKER_HOST:-}" ] && answers unix:///var/run/docker.sock; then
        host=unix:///var/run/docker.sock
    elif answers "$sock"; then
        host=$sock
    fi
    if [ -n "$host" ]; then
        say "engine answers on $host ($(since "$t"))"
    else
        host=$sock
        need_root "starting a private dockerd"
        mkdir -p /run
        exec 9>/run/reconciler-test-docker.lock
        flock 9 # one starter at a time (parallel test sessions)
        if ! answers "$sock"; then
            command -v dockerd >/dev/null || apt_install docker.io
            local pid=""
            [ -f "$pidfile" ] && pid=$(cat "$pidfile" 2>/dev/null || true)
            if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
                say "dockerd (pid $pid) is running but not answering yet; waiting"
            else
                say "starting dockerd on $sock (data root $data_root, log $log)"
                mkdir -p "$data_root" "$exec_root"
                rm -f "${sock#unix://}"
                # Own exec root and pidfile, so it never collides with a system dockerd. Close fd 3 (the
                # caller's stdout: a pipe would never end) and fds 8 and 9 (the locks) in the daemon.
                nohup setsid dockerd --host "$sock" --data-root "$data_root" --exec-root "$exec_root" \
                    --pidfile "$pidfile" </dev/null >>"$log" 2>&1 3>&- 8>&- 9>&- &
            fi
            local i
            for ((i = 0; i < 120; i++)); do
                answers "$sock" && break
                sleep 0.5
            done
            if ! answers "$sock"; then
                say "error: dockerd did not answer on $sock within 60 s; last lines of $log:"
                tail -n 30 "$log" >&2 || true
                exit 1
            fi
        fi
        flock -u 9
        say "engine answers on $sock ($(since "$t")): $(docker -H "$sock" info \
            --format 'server {{.ServerVersion}}, storage {{.Driver}}, cgroup v{{.CgroupVersion}} ({{.CgroupDriver}})' \
            2>/dev/null || true)"
    fi
    export DOCKER_HOST=$host

    # --- 2. the images -------------------------------------------------------------------------
    if [ -z "${RECONCILER_SKIP_IMAGES:-}" ]; then
        exec 8>>"${TMPDIR:-/tmp}/reconciler-images.$(id -u).lock"
        flock 8 # one builder at a time (parallel test sessions)
        local tmp
        tmp=$(mktemp -d /tmp/reconciler-images.XXXXXX)
        trap 'rm -rf "$tmp"' EXIT
        busybox_rootfs() { # busybox_rootfs DIR
            local bb=/bin/busybox
            if command -v dpkg-query >/dev/null; then
                dpkg-query -W -f '${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' \
                    || apt_install busybox-static
            elif [ ! -x "$bb" ]; then
                apt_install busybox-static
            fi
            mkdir -p "$1"/bin "$1"/etc "$1"/tmp "$1"/www "$1"/proc "$1"/sys "$1"/dev
            chmod 1777 "$1"/tmp
            cp "$bb" "$1"/bin/busybox
            local a
            for a in sh ls cat sleep echo httpd wget nc kill mkdir rm env id; do ln -sf busybox "$1/bin/$a"; done
            printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' >"$1"/etc/passwd
            printf 'root:x:0:\nnogroup:x:65534:\n' >"$1"/etc/group
        }
        local tag
        for tag in 1 2; do
            if have_image "reconciler-test/busybox:$tag"; then
                say "image reconciler-test/busybox:$tag present"
                continue
            fi
            t=$(date +%s%N)
            rm -rf "$tmp/bb"
            busybox_rootfs "$tmp/bb"
            [ "$tag" = 1 ] || echo "$tag" >"$tmp/bb/etc/image-version"
            tar --numeric-owner -C "$tmp/bb" -c . |
                docker import -c 'CMD ["/bin/sh"]' - "reconciler-test/busybox:$tag" >/dev/null
            say "built reconciler-test/busybox:$tag ($(since "$t"))"
        done

        local py=reconciler-example/python:3.11
        if have_image "$py"; then
            say "image $py present"
        else
            t=$(date +%s%N)
            local tarball=$cache/python3.11-$suite-minbase.tar
            if [ ! -s "$tarball" ]; then
                need_root "debootstrap (building $py)"
                command -v debootstrap >/dev/null || apt_install debootstrap
                mkdir -p "$cache"
                local root=$tmp/python-root
                say "debootstrap $suite minbase + python3 into $root ..."
                if ! debootstrap --variant=minbase --include=python3-minimal,libpython3.11-stdlib \
                    "$suite" "$root" "$mirror" >"$tmp/debootstrap.log" 2>&1; then
                    tail -n 30 "$tmp/debootstrap.log" >&2
                    say "error: debootstrap failed (full log above, last 30 lines)"
                    exit 1
                fi
                say "debootstrap: $(since "$t")"
                chroot "$root" python3 -c 'import sys; assert sys.version_info >= (3, 11), sys.version'
                # Smaller image: no package caches, docs or manuals.
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
            local t2
            t2=$(date +%s%N)
            docker import -c 'CMD ["python3"]' -c 'ENV LANG=C.UTF-8' "$tarball" "$py" >/dev/null
            say "docker import $py: $(since "$t2")"
            docker run --rm "$py" python3 -c \
                'import http.server, configparser, json, tomllib, urllib.request, sys; print(sys.version.split()[0])' \
                >"$tmp/pyver" || { say "error: $py cannot run python3 with the needed stdlib modules"; exit 1; }
            say "built $py, python $(cat "$tmp/pyver") ($(since "$t"))"
        fi
    fi
    # --- 3. a container starts: an engine can answer and still have lost its bridge -------------
    local smoke
    if [ -z "${RECONCILER_SKIP_IMAGES:-}" ] && ! smoke=$(docker run --rm reconciler-test/busybox:1 /bin/sh -c : 2>&1); then
        if [ "$host" = "$sock" ] && [ -z "${RECONCILER_ENGINE_RESTARTED:-}" ] && [ -f "$pidfile" ]; then
            say "containers cannot start (${smoke//$'\n'/ }); restarting the private dockerd"
            local old j
            old=$(cat "$pidfile")
            kill "$old" 2>/dev/null || true
            for ((j = 0; j < 60; j++)); do
                kill -0 "$old" 2>/dev/null || break
                sleep 0.5
            done
            exec 8>&- # the image builders' lock: the second round takes it again
            RECONCILER_ENGINE_RESTARTED=1 _reconciler_docker_engine >&3
            exit $?
        fi
        say "error: containers cannot start on $host: $smoke"
        exit 1
    fi
    say "ready in $(since "$t_all")"
    echo "export DOCKER_HOST=$host" >&3
)

if [ "${BASH_SOURCE[0]}" != "$0" ]; then
    # Sourced: run in a subshell (no set -e leaking) and export DOCKER_HOST here.
    if _reconciler_out=$(_reconciler_docker_engine); then
        eval "$(printf '%s\n' "$_reconciler_out" | tail -n 1)"
        unset _reconciler_out
    else
        unset _reconciler_out
        return 1
    fi
else
    _reconciler_docker_engine
fi
