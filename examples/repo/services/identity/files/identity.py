"""Identity API stand-in (Keystone-like): issues tokens and keeps them in the db service.

Reads its config from one or more INI files (``--config identity.conf --config db-auth.conf``,
later ones adding to earlier ones): [DEFAULT] debug (bool), region; [api] port; [token] ttl
(int), provider; [database] url (base URL of the db service, e.g. http://127.0.0.1:18106) and
password (the db's, sent as HTTP basic auth; in db-auth.conf, the one secret file).
Endpoints: GET /v3 (version document), POST /v3/auth/tokens (201 with a new token stored in
the db as token-<id>; 503 if the db does not answer or refuses the password), GET /healthz
(liveness only: 200 even when the db is down), GET /status (never the password).
SIGHUP re-reads the config in place; SIGTERM/SIGINT stop cleanly.
"""

from __future__ import annotations

import argparse
import base64
import configparser
import json
import os
import secrets
import signal
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SERVICE = os.environ.get("RECONCILER_SERVICE", "identity")
NODE = os.environ.get("RECONCILER_NODE", "local")
COMMIT = os.environ.get("RECONCILER_COMMIT", "unknown")
DB_TIMEOUT = 2.0

config: dict[str, Any] = {}


def log(msg: str) -> None:
    print(f"{SERVICE} {msg}", flush=True)


def load_config(paths: list[str]) -> dict[str, Any]:
    """Parse and check identity.conf (and what the other files add); raise ValueError when one
    is missing or the result is unusable."""
    ini = configparser.ConfigParser(interpolation=None)
    try:
        for path in paths:
            if not ini.read(path):
                raise ValueError(f"cannot read {path}")
        cfg: dict[str, Any] = {"debug": ini.getboolean("DEFAULT", "debug", fallback=False),
                               "region": ini["DEFAULT"]["region"], "port": int(ini["api"]["port"]),
                               "token_ttl": int(ini["token"]["ttl"]), "provider": ini["token"]["provider"],
                               "database_url": ini["database"]["url"].rstrip("/"),
                               "database_password": ini["database"]["password"]}
    except KeyError as e:
        raise ValueError(f"missing {e}") from None
    except configparser.Error as e:
        raise ValueError(" ".join(str(e).split())) from None
    if not 0 < cfg["port"] < 65536 or cfg["token_ttl"] < 1:
        raise ValueError("port must be 1-65535 and [token] ttl >= 1")
    if not cfg["database_url"].startswith(("http://", "https://")):
        raise ValueError(f"[database] url must be an http(s) URL, not {cfg['database_url']!r}")
    return cfg


def shown(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config as /status shows it: everything but the password."""
    return {k: v for k, v in cfg.items() if k != "database_password"}


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

    def do_GET(self) -> None:
        cfg = config
        if self.path == "/healthz":
            self.reply(200, "ok")
        elif self.path == "/status":
            self.reply(200, {"service": SERVICE, "node": NODE, "commit": COMMIT, "pid": os.getpid(), "config": shown(cfg)})
        elif self.path.rstrip("/") == "/v3":
            self.reply(200, {"version": "v3", "node": NODE, "region": cfg["region"], "token_ttl": cfg["token_ttl"],
                             "provider": cfg["provider"], "debug": cfg["debug"]})
        else:
            self.reply(404, {"error": "not found"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))  # credentials: not checked here
        if self.path != "/v3/auth/tokens":
            return self.reply(404, {"error": "not found"})
        cfg = config
        token = secrets.token_hex(16)
        record = {"node": NODE, "provider": cfg["provider"], "expires_at": int(time.time()) + cfg["token_ttl"]}
        auth = base64.b64encode(f"identity:{cfg['database_password']}".encode()).decode()
        req = urllib.request.Request(f"{cfg['database_url']}/kv/token-{token}", data=json.dumps(record).encode(),
                                     method="PUT", headers={"Content-Type": "application/json",
                                                            "Authorization": f"Basic {auth}"})
        try:
            with urllib.request.urlopen(req, timeout=DB_TIMEOUT) as resp:
                resp.read()
        except OSError as e:  # URLError, HTTPError, timeouts, refused connections
            reason = getattr(e, "reason", e)
            log(f"cannot store token in {cfg['database_url']}: {reason}")
            return self.reply(503, {"error": f"database unavailable: {reason}"})
        if cfg["debug"]:
            log(f"issued token {token[:8]}... ttl={cfg['token_ttl']}")
        return self.reply(201, {"token": token, "expires_in": cfg["token_ttl"]})


def main() -> int:
    global config
    ap = argparse.ArgumentParser(description="Identity API stand-in (Keystone-like).")
    ap.add_argument("--config", required=True, action="append", help="an INI file; repeat to add more")
    args = ap.parse_args()
    try:
        config = load_config(args.config)
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
