"""Compute agent stand-in (nova-compute-like): heartbeats to the control plane.

Reads ``compute.json``: {"port": int, "identity_url": str (through the lb), "db_url": str,
"interval": float, "hypervisor": str, "vcpus": int}. Every `interval` seconds a background
thread GETs {identity_url}/v3, then PUTs {"node", "time", "vcpus", "hypervisor"} as JSON to
{db_url}/kv/compute-<node>, and records the last success and the last error.
Endpoints: GET /healthz (liveness), GET /status (config, last heartbeat, last error).
SIGHUP re-reads the config in place; SIGTERM/SIGINT stop cleanly.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SERVICE = os.environ.get("RECONCILER_SERVICE", "compute-agent")
NODE = os.environ.get("RECONCILER_NODE", "local")
COMMIT = os.environ.get("RECONCILER_COMMIT", "unknown")
HTTP_TIMEOUT = 2.0

config: dict[str, Any] = {}
state: dict[str, Any] = {"heartbeats": 0, "last_success": None, "last_error": None, "last_error_message": None,
                         "identity": None}
stopping = threading.Event()


def log(msg: str) -> None:
    print(f"{SERVICE} {msg}", flush=True)


def load_config(path: str) -> dict[str, Any]:
    """Read and check compute.json; raise ValueError when it is missing or unusable."""
    try:
        with open(path) as f:
            cfg = json.load(f)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    if not isinstance(cfg, dict):
        raise ValueError("the config must be a JSON object")
    types = {"port": int, "identity_url": str, "db_url": str, "interval": int | float, "hypervisor": str, "vcpus": int}
    for key, want in types.items():
        if not isinstance(cfg.get(key), want) or isinstance(cfg.get(key), bool):
            raise ValueError(f"{key} is missing or not {getattr(want, '__name__', want)}")
    if not 0 < cfg["port"] < 65536 or cfg["interval"] <= 0 or cfg["vcpus"] < 1:
        raise ValueError("want port 1-65535, interval > 0, vcpus >= 1")
    for key in ("identity_url", "db_url"):
        if not cfg[key].startswith(("http://", "https://")):
            raise ValueError(f"{key} must be an http(s) URL")
        cfg[key] = cfg[key].rstrip("/")
    return {key: cfg[key] for key in types}


def call(req: urllib.request.Request) -> tuple[bytes, str | None]:
    """Body and X-Backend header of one request; RuntimeError naming the request if it fails."""
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as resp:
            return resp.read(), resp.headers.get("X-Backend")
    except OSError as e:  # URLError, HTTPError, timeouts, refused connections
        raise RuntimeError(f"{req.get_method()} {req.full_url}: {getattr(e, 'reason', e)}") from None


def heartbeat(cfg: dict[str, Any]) -> None:
    """One round: ask identity (through the lb) for its version, then record ourselves in the db."""
    data, backend = call(urllib.request.Request(f"{cfg['identity_url']}/v3"))
    version = json.loads(data)
    body = {"node": NODE, "time": time.time(), "vcpus": cfg["vcpus"], "hypervisor": cfg["hypervisor"]}
    call(urllib.request.Request(f"{cfg['db_url']}/kv/compute-{NODE}", data=json.dumps(body).encode(),
                                method="PUT", headers={"Content-Type": "application/json"}))
    state["identity"] = {"backend": backend, "node": version.get("node"), "region": version.get("region")}


def loop() -> None:
    while not stopping.is_set():
        cfg = config  # a reload takes effect from the next round
        try:
            heartbeat(cfg)
        except (RuntimeError, ValueError, AttributeError) as e:  # failed request, bad JSON
            state.update(last_error=time.time(), last_error_message=str(e))
            log(f"heartbeat failed: {state['last_error_message']}")
        else:
            state["heartbeats"] += 1
            state["last_success"] = time.time()
        stopping.wait(cfg["interval"])


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
        if self.path == "/healthz":
            self.reply(200, "ok")
        elif self.path == "/status":
            self.reply(200, {"service": SERVICE, "node": NODE, "commit": COMMIT, "pid": os.getpid(),
                             "config": config, **state})
        else:
            self.reply(404, {"error": "not found"})


def main() -> int:
    global config
    ap = argparse.ArgumentParser(description="Compute agent stand-in (nova-compute-like).")
    ap.add_argument("--config", required=True)
    args = ap.parse_args()
    try:
        config = load_config(args.config)
        server = ThreadingHTTPServer(("127.0.0.1", config["port"]), Handler)
    except (OSError, ValueError) as e:
        print(f"{SERVICE}: cannot start with {args.config}: {e}", file=sys.stderr, flush=True)
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

    def stop(*_: Any) -> None:
        stopping.set()
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=reload).start())
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    worker = threading.Thread(target=loop, name="heartbeat", daemon=True)
    worker.start()
    log(f"ready on 127.0.0.1:{config['port']} (node={NODE}, commit={COMMIT})")
    server.serve_forever(poll_interval=0.1)  # SIGTERM stops it within 0.1 s, not 0.5 s
    server.server_close()
    worker.join(timeout=HTTP_TIMEOUT * 2 + 1)
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
