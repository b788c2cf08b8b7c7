"""Database stand-in (a Galera-like member): a small key-value store over HTTP.

Reads its config from one or more INI files (``--config db.conf --config db-auth.conf``, later
ones adding to earlier ones), section [db]: name, port, peers (comma-separated host:port, may be
empty), max_connections, password (in a file of its own, db-auth.conf: the one secret file).
Data lives in $RECONCILER_DATA_DIR/db.json (./data when run by hand), loaded at start and
rewritten atomically on every PUT. Peers are only listed, not replicated to.
Endpoints: PUT /kv/<key> (body = value), GET /kv/<key>, GET /healthz, GET /status.
A /kv/ request needs the password (HTTP basic auth, any user name: identity sends its own),
except keys under ``compute-``: the computes' heartbeats, written by nodes that hold none of
the controllers' secrets. The password is never printed, not even in /status.
SIGHUP re-reads the config in place; SIGTERM/SIGINT stop cleanly.
"""

from __future__ import annotations

import argparse
import base64
import configparser
import hmac
import json
import os
import signal
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SERVICE = os.environ.get("RECONCILER_SERVICE", "db")
NODE = os.environ.get("RECONCILER_NODE", "local")
COMMIT = os.environ.get("RECONCILER_COMMIT", "unknown")
DATA_DIR = os.environ.get("RECONCILER_DATA_DIR") or os.path.join(os.getcwd(), "data")
DATA_FILE = os.path.join(DATA_DIR, "db.json")

config: dict[str, Any] = {}
store: dict[str, str] = {}
store_lock = threading.Lock()  # guards store and the data file
count_lock = threading.Lock()
active = 0  # requests in flight, checked against max_connections


def log(msg: str) -> None:
    print(f"{SERVICE} {msg}", flush=True)


OPEN_PREFIX = "compute-"  # heartbeats of the computes: no password (they are not its recipients)


def load_config(paths: list[str]) -> dict[str, Any]:
    """Parse and check db.conf (and what the other files add); raise ValueError when one is
    missing or the result is unusable."""
    ini = configparser.ConfigParser(interpolation=None)
    try:
        for path in paths:
            if not ini.read(path):
                raise ValueError(f"cannot read {path}")
        db = ini["db"]
        peers = [p.strip() for p in db.get("peers", "").split(",") if p.strip()]
        for p in peers:
            host, _, port = p.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"bad peer {p!r} (want host:port)")
        cfg: dict[str, Any] = {"name": db["name"], "port": int(db["port"]), "peers": peers,
                               "max_connections": int(db["max_connections"]), "password": db["password"]}
    except KeyError as e:
        raise ValueError(f"missing {e}") from None
    except configparser.Error as e:
        raise ValueError(" ".join(str(e).split())) from None
    if not 0 < cfg["port"] < 65536 or cfg["max_connections"] < 1:
        raise ValueError("port must be 1-65535 and max_connections >= 1")
    if not cfg["password"]:
        raise ValueError("password must not be empty")
    return cfg


def shown(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config as /status shows it: everything but the password."""
    return {k: v for k, v in cfg.items() if k != "password"}


def save() -> None:
    """Write the store atomically: temp file, fsync, rename, fsync the directory."""
    tmp = DATA_FILE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(store, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, DATA_FILE)
    fd = os.open(DATA_DIR, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log(f"{self.address_string()} {format % args}")

    def reply(self, code: int, body: Any) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode() + b"\n"
        self.send_response(code)
        self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_one_request(self) -> None:
        global active
        with count_lock:
            active += 1
        try:
            super().handle_one_request()
        finally:
            with count_lock:
                active -= 1

    def authorised(self, key: str) -> bool:
        if key.startswith(OPEN_PREFIX):
            return True
        kind, _, encoded = (self.headers.get("Authorization") or "").partition(" ")
        try:
            _, _, given = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return kind.lower() == "basic" and hmac.compare_digest(given.encode(), config["password"].encode())

    def key(self) -> str | None:
        """The key of a /kv/<key> request; None (after a 401, 404 or 503 reply) when there is none."""
        if not self.path.startswith("/kv/") or self.path == "/kv/":
            self.reply(404, {"error": "not found"})
        elif active > config["max_connections"]:
            self.reply(503, {"error": "too many connections"})
        elif not self.authorised(key := urllib.parse.unquote(self.path[4:])):
            self.reply(401, {"error": "wrong or missing password"})
        else:
            return key
        return None

    def do_GET(self) -> None:
        if self.path == "/healthz":
            return self.reply(200, "ok")
        if self.path == "/status":
            with store_lock:
                keys = len(store)
            return self.reply(200, {"service": SERVICE, "node": NODE, "commit": COMMIT, "pid": os.getpid(),
                                    "config": shown(config), "keys": keys, "peers": config["peers"],
                                    "connections": active, "data_file": DATA_FILE})
        if (key := self.key()) is not None:
            with store_lock:
                value = store.get(key)
            self.reply(404, {"error": f"no key {key!r}"}) if value is None else self.reply(200, value)

    def do_PUT(self) -> None:
        value = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode(errors="replace")
        if (key := self.key()) is not None:
            with store_lock:
                store[key] = value
                save()
            self.reply(200, {"stored": key})


def main() -> int:
    global config, store
    ap = argparse.ArgumentParser(description="Database stand-in (Galera-like key-value store).")
    ap.add_argument("--config", required=True, action="append", help="an INI file; repeat to add more")
    args = ap.parse_args()
    try:
        config = load_config(args.config)
        os.makedirs(DATA_DIR, exist_ok=True)
        if os.path.exists(DATA_FILE):
            with open(DATA_FILE) as f:
                store = json.load(f)
        server = ThreadingHTTPServer(("127.0.0.1", config["port"]), Handler)
    except (OSError, ValueError) as e:
        print(f"{SERVICE}: cannot start with {', '.join(args.config)}: {e}", file=sys.stderr, flush=True)
        return 2
    server.daemon_threads = True

    def reload() -> None:
        global config
        try:
            new = load_config(args.config)
        except ValueError as e:
            return log(f"reload failed, keeping the old config: {e}")
        if new["port"] != config["port"]:
            log(f"a reload cannot change the port: still {config['port']}, restart to use {new['port']}")
            new["port"] = config["port"]
        config = new
        log("reloaded config")

    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=reload).start())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: threading.Thread(target=server.shutdown).start())
    log(f"ready on 127.0.0.1:{config['port']} (node={NODE}, commit={COMMIT})")
    server.serve_forever(poll_interval=0.1)  # SIGTERM stops it within 0.1 s, not 0.5 s
    server.server_close()
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
