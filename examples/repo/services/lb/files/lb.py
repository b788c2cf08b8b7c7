"""Load balancer stand-in (HAProxy-like): round-robin HTTP proxy in front of the identity APIs.

Reads ``lb.json``: {"port": int, "timeout": float, "backends": [{"name": str, "url": str}]}.
GET /healthz and GET /status (per-backend up/down as last seen, request counts) are answered
here; any other request is forwarded (method, path, body, Content-Type) to the next backend in
turn, skipping one that does not answer; 502 when none does. Responses carry X-Backend: <name>.
SIGHUP re-reads the config in place; SIGTERM/SIGINT stop cleanly.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SERVICE = os.environ.get("RECONCILER_SERVICE", "lb")
NODE = os.environ.get("RECONCILER_NODE", "local")
COMMIT = os.environ.get("RECONCILER_COMMIT", "unknown")

config: dict[str, Any] = {}
stats: dict[str, dict[str, Any]] = {}  # backend name -> up, last_seen, requests, failures
lock = threading.Lock()
turn = itertools.count()


def log(msg: str) -> None:
    print(f"{SERVICE} {msg}", flush=True)


def load_config(path: str) -> dict[str, Any]:
    """Read and check lb.json; raise ValueError when it is missing or unusable."""
    try:
        with open(path) as f:
            cfg = json.load(f)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("port"), int) or not 0 < cfg["port"] < 65536:
        raise ValueError("port must be an integer 1-65535")
    if not isinstance(cfg.get("timeout"), int | float) or cfg["timeout"] <= 0:
        raise ValueError("timeout must be a positive number")
    backends = cfg.get("backends")
    if not isinstance(backends, list) or not backends:
        raise ValueError("backends must be a non-empty list")
    for b in backends:
        if not isinstance(b, dict) or not isinstance(b.get("name"), str) or \
                not str(b.get("url", "")).startswith("http://"):
            raise ValueError(f"bad backend {b!r}: want {{'name': str, 'url': 'http://...'}}")
        b["url"] = b["url"].rstrip("/")
    if len({b["name"] for b in backends}) != len(backends):
        raise ValueError("backend names must be unique")
    return {"port": cfg["port"], "timeout": float(cfg["timeout"]), "backends": backends}


def use(cfg: dict[str, Any]) -> None:
    """Make cfg the effective config, keeping the counters of backends it still has."""
    global config
    with lock:
        for b in cfg["backends"]:
            stats.setdefault(b["name"], {"up": None, "last_seen": None, "requests": 0, "failures": 0})
        for name in set(stats) - {b["name"] for b in cfg["backends"]}:
            del stats[name]
        config = cfg


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log(f"{self.address_string()} {format % args}")

    def reply(self, code: int, body: bytes, ctype: str, backend: str | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if backend:
            self.send_header("X-Backend", backend)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            return self.reply(200, b"ok\n", "text/plain")
        if self.path == "/status":
            with lock:
                body = {"service": SERVICE, "node": NODE, "commit": COMMIT, "pid": os.getpid(), "config": config,
                        "backends": {name: dict(s) for name, s in stats.items()}}
            return self.reply(200, json.dumps(body).encode() + b"\n", "application/json")
        return self.proxy()

    def do_POST(self) -> None:
        self.proxy()

    do_PUT = do_DELETE = do_POST

    def proxy(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        cfg = config
        backends = cfg["backends"]
        start = next(turn)
        for b in (backends[(start + i) % len(backends)] for i in range(len(backends))):
            headers = {"Content-Type": self.headers["Content-Type"]} if self.headers["Content-Type"] else {}
            headers["X-Forwarded-For"] = self.client_address[0]
            req = urllib.request.Request(b["url"] + self.path, data=body, method=self.command, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=cfg["timeout"]) as resp:
                    status, data, ctype = resp.status, resp.read(), resp.headers.get("Content-Type")
            except urllib.error.HTTPError as e:  # the backend answered, with an error status: pass it on
                status, data, ctype = e.code, e.read(), e.headers.get("Content-Type")
            except OSError as e:  # refused, reset, timed out: try the next backend
                log(f"backend {b['name']} ({b['url']}) failed: {getattr(e, 'reason', e)}")
                self.count(b["name"], up=False)
                continue
            self.count(b["name"], up=True)
            return self.reply(status, data, ctype or "application/octet-stream", backend=b["name"])
        return self.reply(502, b'{"error": "no backend available"}\n', "application/json")

    def count(self, name: str, up: bool) -> None:
        with lock:
            if s := stats.get(name):
                s.update(up=up, last_seen=time.time())
                s["requests" if up else "failures"] += 1


def main() -> int:
    ap = argparse.ArgumentParser(description="Load balancer stand-in (HAProxy-like).")
    ap.add_argument("--config", required=True)
    args = ap.parse_args()
    try:
        use(load_config(args.config))
        server = ThreadingHTTPServer(("127.0.0.1", config["port"]), Handler)
    except (OSError, ValueError) as e:
        print(f"{SERVICE}: cannot start with {args.config}: {e}", file=sys.stderr, flush=True)
        return 2
    server.daemon_threads = True

    def reload() -> None:
        try:
            new = load_config(args.config)
        except ValueError as e:
            return log(f"reload failed, keeping the old config: {e}")
        if new["port"] != config["port"]:
            log(f"a reload cannot change the port: still {config['port']}, restart to use {new['port']}")
            new["port"] = config["port"]
        use(new)
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
