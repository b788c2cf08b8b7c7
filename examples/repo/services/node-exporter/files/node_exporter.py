"""Metrics exporter stand-in (Prometheus node_exporter-like), one per node.

Reads ``exporter.toml`` (TOML): port (int) and a [labels] table of string -> string, added to
every node_* series next to node="<RECONCILER_NODE>" (a `node` label in the table wins).
Endpoints: GET /metrics (Prometheus text: node_up, node_uptime_seconds, node_load1,
process_config_reloads_total), GET /healthz, GET /status. The nodes of the demo share one
machine, so node_uptime_seconds is the time since this exporter started.
SIGHUP re-reads the config in place; SIGTERM/SIGINT stop cleanly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SERVICE = os.environ.get("RECONCILER_SERVICE", "node-exporter")
NODE = os.environ.get("RECONCILER_NODE", "local")
COMMIT = os.environ.get("RECONCILER_COMMIT", "unknown")
STARTED = time.monotonic()
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

config: dict[str, Any] = {}
reloads = 0


def log(msg: str) -> None:
    print(f"{SERVICE} {msg}", flush=True)


def load_config(path: str) -> dict[str, Any]:
    """Read and check exporter.toml; raise ValueError when it is missing or unusable."""
    try:
        with open(path, "rb") as f:
            cfg = tomllib.load(f)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"bad TOML: {e}") from None
    port, labels = cfg.get("port"), cfg.get("labels", {})
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ValueError("port must be an integer 1-65535")
    if not isinstance(labels, dict):
        raise ValueError("[labels] must be a table")
    for name, value in labels.items():
        if not LABEL_NAME.fullmatch(name) or name.startswith("__") or not isinstance(value, str):
            raise ValueError(f"bad label {name} = {value!r}: want a valid label name and a string")
    return {"port": port, "labels": labels}


def metrics() -> str:
    def esc(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    labels = "{" + ",".join(f'{k}="{esc(v)}"' for k, v in ({"node": NODE} | config["labels"]).items()) + "}"
    series = [
        ("node_up", "gauge", "1 if the node is up.", "1", labels),
        ("node_uptime_seconds", "gauge", "Seconds since this node's exporter started.",
         f"{time.monotonic() - STARTED:.3f}", labels),
        ("node_load1", "gauge", "1-minute load average.", repr(os.getloadavg()[0]), labels),
        ("process_config_reloads_total", "counter", "Successful config reloads (SIGHUP).", str(reloads), ""),
    ]
    return "".join(f"# HELP {name} {text}\n# TYPE {name} {kind}\n{name}{lab} {value}\n"
                   for name, kind, text, value, lab in series)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log(f"{self.address_string()} {format % args}")

    def reply(self, code: int, body: str, ctype: str = "text/plain") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self.reply(200, "ok\n")
        elif self.path == "/metrics":
            self.reply(200, metrics(), "text/plain; version=0.0.4; charset=utf-8")
        elif self.path == "/status":
            body = {"service": SERVICE, "node": NODE, "commit": COMMIT, "pid": os.getpid(), "config": config,
                    "config_reloads": reloads}
            self.reply(200, json.dumps(body) + "\n", "application/json")
        else:
            self.reply(404, "not found\n")


def main() -> int:
    global config
    ap = argparse.ArgumentParser(description="Metrics exporter stand-in (node_exporter-like).")
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
        global config, reloads
        try:
            new = load_config(args.config)
        except ValueError as e:
            return log(f"reload failed, keeping the old config: {e}")
        if new["port"] != config["port"]:
            log(f"a reload cannot change the port: still {config['port']}, restart to use {new['port']}")
            new["port"] = config["port"]
        config, reloads = new, reloads + 1
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
