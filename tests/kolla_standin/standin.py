#!/usr/bin/env python3
"""A stand-in for kolla's images (tests/test_kolla_converge.py): kolla's container contract for
real, the OpenStack programs faked. Installed as /usr/local/lib/kolla_standin.py (with its
sibling kolla_standin_health.py, the checks of kolla's that read only /proc); the commands
kolla's images provide are links to it, and what it does is chosen by the name it is run as:

- ``kolla_start`` (the image's command): kolla's ``set_configs`` with KOLLA_CONFIG_STRATEGY
  COPY_ALWAYS: /var/lib/kolla/config_files/config.json read, each ``config_files`` entry copied
  (a glob, ``optional``, ``merge`` of directories) to its ``dest`` with its ``owner`` and
  ``perm``, each ``permissions`` entry applied; a missing config.json or source that is not
  optional is an error, as in kolla. Then config.json's ``command`` is run: a script the config
  put in place (keystone-startup.sh) is executed as it is, any other program is faked (``serve``).
- ``serve`` (and ``uwsgi``): listens where the rendered config says the program listens (uWSGI's
  ``http``, memcached's ``-l``/``-p``, sshd_config, galera.cnf's ``[mysqld]``, rabbitmq.conf's
  ``listeners.tcp``, nova.conf's ``[vnc]``), answering HTTP 200 on every path, and keeps a TCP
  connection open to every ``transport_url`` and ``[database] connection`` of its *.conf files, as
  an oslo.messaging and SQLAlchemy service does. Its process name is the program's.
- ``healthcheck_curl``, ``healthcheck_listen``, ``healthcheck_port``, ``healthcheck_rabbitmq``,
  ``healthcheck.sh`` (mariadb): kolla's checks, for real, from /proc (no ss, pgrep, curl here).
- ``kolla_keystone_bootstrap``/``keystone-manage``: fernet keys made in /etc/keystone/fernet-keys.
- ``install USER...`` (at image build): the links, and the users config.json files name.
"""

from __future__ import annotations

import base64
import configparser
import contextlib
import glob
import grp
import http.server
import json
import os
import pwd
import re
import shlex
import shutil
import socket
import socketserver
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

# A sibling file (installed next to this one: python resolves the command links to this file's
# directory, so it is on sys.path).
from kolla_standin_health import fail, healthcheck_curl, healthcheck_listen, healthcheck_port

CONFIG = "/var/lib/kolla/config_files/config.json"
COMMANDS = ("kolla_start", "kolla_set_configs", "uwsgi", "healthcheck_curl", "healthcheck_listen",
            "healthcheck_port", "healthcheck_rabbitmq", "kolla_keystone_bootstrap", "keystone-manage")
SELF = "/usr/local/lib/kolla_standin.py"


# set_configs -------------------------------------------------------------------------------------
def owner_ids(owner: str) -> tuple[int, int]:
    user, _, group = owner.partition(":")
    try:
        entry = pwd.getpwnam(user)
        return entry.pw_uid, grp.getgrnam(group).gr_gid if group else entry.pw_gid
    except KeyError:
        fail(f"owner {owner!r}: no such user or group in the image")
        raise


def chown_chmod(path: str, owner: str, perm: str | None, recurse: bool = True) -> None:
    uid, gid = owner_ids(owner)
    walk = os.walk(path) if recurse and os.path.isdir(path) else [(path, [], [])]
    for root, dirs, files in walk:
        for p in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(p, uid, gid)
            if perm and not os.path.isdir(p):
                os.chmod(p, int(perm, 8))


def set_configs() -> str:
    if os.environ.get("KOLLA_CONFIG_STRATEGY") not in ("COPY_ALWAYS", "COPY_ONCE"):
        fail("KOLLA_CONFIG_STRATEGY must be COPY_ALWAYS or COPY_ONCE")
    try:
        with open(CONFIG) as f:
            config = json.load(f)
    except FileNotFoundError:
        fail(f"{CONFIG} not found: the container has no kolla config")
    for entry in config.get("config_files", []):
        sources = sorted(glob.glob(entry["source"]))
        if not sources:
            if entry.get("optional"):
                continue
            fail(f"{entry['source']}: missing, and not optional")
        for source in sources:
            dest = entry["dest"]
            if dest.endswith("/") or "*" in entry["source"]:
                dest = os.path.join(dest, os.path.basename(source))
            if os.path.isdir(source):
                if os.path.exists(dest) and not entry.get("merge"):
                    shutil.rmtree(dest)
                shutil.copytree(source, dest, dirs_exist_ok=True)
            else:
                if os.path.lexists(dest) and not os.path.isdir(dest):
                    os.remove(dest)
                os.makedirs(os.path.dirname(dest) or "/", exist_ok=True)
                shutil.copy(source, dest)
            if "owner" in entry:
                chown_chmod(dest, entry["owner"], entry.get("perm"))
            elif "perm" in entry:
                os.chmod(dest, int(entry["perm"], 8))
            print(f"INFO: copied {source} to {dest}", flush=True)
    for entry in config.get("permissions", []):
        for path in glob.glob(entry["path"]):
            chown_chmod(path, entry["owner"], entry.get("perm"), bool(entry.get("recurse")))
    command = str(config["command"])
    with open("/run_command", "w") as f:
        f.write(command)
    return command


def kolla_start() -> None:
    command = shlex.split(set_configs())
    program = shutil.which(command[0]) or command[0]
    with contextlib.suppress(OSError):
        with open(program, "rb") as f:
            script = f.read(2) == b"#!" and os.path.realpath(program) != SELF
        if script:  # put in place by the config (keystone-startup.sh): it runs as in kolla
            os.execv(program, [program, *command[1:]])
    os.execv(sys.executable, [sys.executable, SELF, "serve", *command])


# serve -------------------------------------------------------------------------------------------
def config_dests() -> list[str]:
    with contextlib.suppress(OSError, ValueError), open(CONFIG) as f:
        return [e["dest"] for e in json.load(f).get("config_files", [])]
    return []


def ini(path: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    with contextlib.suppress(configparser.Error, OSError, UnicodeDecodeError):
        parser.read(path)
    return parser


def host_port(text: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    return (host.strip("[]") or default_host), int(port)


def listens(argv: list[str]) -> list[tuple[str, int]]:
    """Where the program of ``argv`` listens, read from its command line and rendered config."""
    name = os.path.basename(argv[0])
    out: list[tuple[str, int]] = []
    if name == "uwsgi" and len(argv) > 1:
        for key in ("http", "http-socket", "https"):
            value = ini(argv[1]).get("uwsgi", key, fallback=None)
            if value:
                out.append(host_port(value.split(",")[0]))
    elif name == "memcached":
        args = dict(zip(argv[1:], argv[2:], strict=False))  # each word and the next
        out.append((args.get("-l", "0.0.0.0"), int(args.get("-p", "11211"))))
    dests = config_dests()
    for dest in dests:
        base = os.path.basename(dest)
        if name == "sshd" and base == "sshd_config":
            with open(dest) as f:
                words = dict(line.split(None, 1) for line in f if line.strip() and not line.startswith("#")
                             and len(line.split(None, 1)) == 2)
            out.append((words.get("ListenAddress", "0.0.0.0").strip(), int(words.get("Port", "22"))))
        elif name.startswith(("mariadbd", "mysqld")) and base in ("galera.cnf", "my.cnf"):
            cnf = ini(dest)
            out.append((cnf.get("mysqld", "bind-address", fallback="0.0.0.0"), cnf.getint("mysqld", "port",
                                                                                           fallback=3306)))
        elif name == "rabbitmq-server" and base == "rabbitmq.conf":
            with open(dest) as f:
                out += [host_port(m.group(1)) for m in re.finditer(r"^listeners\.tcp\.\w+\s*=\s*(\S+)", f.read(), re.M)]
        elif name == "nova-novncproxy" and base == "nova.conf":
            vnc = ini(dest)
            out.append((vnc.get("vnc", "novncproxy_host", fallback="0.0.0.0"),
                        vnc.getint("vnc", "novncproxy_port", fallback=6080)))
    return out


def peers() -> list[tuple[str, int]]:
    """The message queue and database of every oslo *.conf in place: where it connects."""
    out: list[tuple[str, int]] = []
    for dest in config_dests():
        if not dest.endswith(".conf"):
            continue
        conf = ini(dest)
        for section, key in (("DEFAULT", "transport_url"), ("database", "connection")):
            url = conf.get(section, key, fallback="")
            netloc = urllib.parse.urlsplit(url).netloc if "://" in url else ""
            for part in netloc.split(","):
                part = part.rpartition("@")[2]
                if part and ":" in part:
                    out.append(host_port(part, "127.0.0.1"))
    return sorted(set(out))


class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = f"stand-in {os.environ.get('KOLLA_SERVICE_NAME', '')}: ok\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def stay_connected(peer: tuple[str, int]) -> None:
    while True:
        try:
            with socket.create_connection(peer, timeout=5) as s:
                s.settimeout(None)
                print(f"INFO: connected to {peer[0]}:{peer[1]}", flush=True)
                while s.recv(4096):
                    pass
        except OSError:
            pass
        time.sleep(1)


def serve(argv: list[str]) -> None:
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        # The process name (what ss and the health scripts see): the program's, as kolla's.
        ctypes.CDLL(None).prctl(15, os.path.basename(argv[0]).encode()[:15], 0, 0, 0)
    for peer in peers():
        threading.Thread(target=stay_connected, args=(peer,), daemon=True).start()
    for host, port in listens(argv):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        Server.address_family = family
        for _ in range(50):  # the previous container of a restart may still hold the port
            try:
                server = Server((host, port), Answer)
                break
            except OSError:
                time.sleep(0.2)
        else:
            fail(f"cannot listen on {host}:{port}")
        threading.Thread(target=server.serve_forever, daemon=True).start()
        print(f"INFO: {argv[0]} listening on {host}:{port}", flush=True)
    print(f"INFO: stand-in for {shlex.join(argv)} running", flush=True)
    while True:
        time.sleep(3600)


# health checks (kolla_standin_health.py: kolla's own; these read the stand-in's config) -----
def healthcheck_rabbitmq() -> None:
    """kolla's healthcheck_rabbitmq (rabbitmq-diagnostics check_running): the broker runs and
    listens where rabbitmq.conf says."""
    with open("/etc/rabbitmq/rabbitmq.conf") as f:
        ports = [host_port(m.group(1))[1] for m in re.finditer(r"^listeners\.tcp\.\w+\s*=\s*(\S+)", f.read(), re.M)]
    if not ports:
        fail("rabbitmq.conf has no listeners.tcp")
    healthcheck_listen("rabbitmq-server", str(ports[0]))


def healthcheck_mariadb(args: list[str]) -> None:
    """The mariadb image's healthcheck.sh --defaults-file F --connect: the server answers on
    the address and port of F's client section (else its own [mysqld] section)."""
    cnf = ini(args[args.index("--defaults-file") + 1]) if "--defaults-file" in args else ini("/etc/my.cnf")
    server = ini("/etc/mysql/my.cnf")
    for d in config_dests():
        if d.endswith((".cnf",)):
            server.read(d)
    host = cnf.get("mariadb-client", "host", fallback=server.get("mysqld", "bind-address", fallback="127.0.0.1"))
    port = cnf.getint("mariadb-client", "port", fallback=server.getint("mysqld", "port", fallback=3306))
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        fail(f"mariadb at {host}:{port}: {exc}")


def fernet_setup() -> None:
    """keystone-manage fernet_setup (kolla_keystone_bootstrap): keys 0 and 1, keystone's own."""
    keys = "/etc/keystone/fernet-keys"
    os.makedirs(keys, exist_ok=True)
    for n in ("0", "1"):
        if not os.path.exists(f"{keys}/{n}"):
            with open(f"{keys}/{n}", "wb") as f:
                f.write(base64.urlsafe_b64encode(os.urandom(32)))
    chown_chmod(keys, "keystone:keystone", "0600")


def install(owners: list[str]) -> None:
    """The links, and a user (its own group) or group for each ``user[:group]`` of ``owners``."""
    for name in COMMANDS:
        os.symlink(SELF, f"/usr/local/bin/{name}")
    os.symlink(SELF, "/usr/bin/healthcheck.sh")
    users = {o.partition(":")[0] for o in owners} - {"root"}
    groups = ({o.partition(":")[2] for o in owners} | users) - {"", "root"}
    for gid, group in enumerate(sorted(groups), start=42401):  # kolla's ids start at 42400
        with open("/etc/group", "a") as f:
            f.write(f"{group}:x:{gid}:\n")
    for user in sorted(users):
        gid = grp.getgrnam(user).gr_gid
        with open("/etc/passwd", "a") as f:
            f.write(f"{user}:x:{gid}:{gid}:{user}:/var/lib/{user}:/usr/sbin/nologin\n")


def main() -> None:
    name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
    if name in ("kolla_standin.py", "standin.py") and args:
        name, args = args[0], args[1:]
    if name == "kolla_start":
        kolla_start()
    elif name == "kolla_set_configs":
        set_configs()
    elif name == "serve":
        serve(args)
    elif name == "uwsgi":
        serve(["uwsgi", *args])
    elif name == "healthcheck_curl":
        healthcheck_curl(args)
    elif name == "healthcheck_listen":
        healthcheck_listen(*args[:2])
    elif name == "healthcheck_port":
        healthcheck_port(args[0], *args[1:])
    elif name == "healthcheck_rabbitmq":
        healthcheck_rabbitmq()
    elif name == "healthcheck.sh":
        healthcheck_mariadb(args)
    elif name in ("kolla_keystone_bootstrap", "keystone-manage"):
        fernet_setup()
    elif name == "install":
        install(args)
    else:
        fail(f"kolla stand-in: no command {name!r}")


if __name__ == "__main__":
    main()
