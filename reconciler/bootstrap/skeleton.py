"""``reconciler init DIR``: a deployment repo to start from, signed from its first commit.

One node, one group, one service the process driver runs (a small HTTP server, as the demo's
services are), the operator's SSH key as the repo's trust root (``trust/allowed_signers``: the
file a node's ``trust.allowed_signers`` copies), an empty ``trust/nodes`` for ``node add``, and
``.sops.yaml`` naming the operator's age recipient. Git is set up in the repo alone (never the
user's global config) to sign every commit with that key, and the first commit is signed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reconciler.bootstrap import keys
from reconciler.bootstrap.keys import run
from reconciler.core.errors import BadInput

BRANCH_TRAILER = "Reconciler-Branch"


@dataclass(frozen=True)
class InitRequest:
    directory: Path
    node: str
    email: str
    user_name: str
    keys_dir: Path
    """Where a key made here goes (never inside the repo: it would be committed)."""
    key: Path | None = None
    age_identity: Path | None = None
    branch: str = "main"


@dataclass(frozen=True)
class Initialised:
    directory: Path
    commit: str
    signing_key: Path
    signing_key_made: bool
    age_identity: Path
    age_identity_made: bool
    age_recipient: str
    principal: str
    node: str
    branch: str


def init(req: InitRequest) -> Initialised:
    """Make the repo at ``req.directory`` (absent or empty), its keys when not given, and commit."""
    target = req.directory
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise BadInput(f"{target}: not empty; reconciler init makes a new repo in an empty or new directory")
    if not _NAME_OK(req.node):
        raise BadInput(f"--node {req.node!r}: a node name is letters, digits, '.', '_' and '-'")
    if req.keys_dir.resolve().is_relative_to(target.resolve()):
        raise BadInput(f"--keys-dir {req.keys_dir}: inside {target}, the keys would be committed with the repo; "
                       "keep them out of it")
    signing_key = req.key or req.keys_dir / "operator_ed25519"
    if req.key is None:
        signer_public = keys.make_ssh_key(signing_key, f"reconciler operator {req.email}")
    else:
        signer_public = keys.ssh_public(req.key)
    age_identity = req.age_identity or req.keys_dir / "operator.agekey"
    recipient = keys.make_age_key(age_identity) if req.age_identity is None else keys.age_public(age_identity)
    target.mkdir(parents=True, exist_ok=True)
    written = files(target.resolve().name, req.node, req.email, signer_public, recipient)
    for rel, text in written.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git = ("git", "-C", str(target))
    run(*git, "init", "-q", "-b", req.branch)
    for key, value in (("user.name", req.user_name), ("user.email", req.email), ("gpg.format", "ssh"),
                       ("user.signingkey", str(signing_key.resolve())), ("commit.gpgsign", "true"),
                       ("tag.gpgsign", "true"), ("gpg.ssh.allowedSignersFile", "trust/allowed_signers")):
        run(*git, "config", "--local", key, value)
    run(*git, "add", "--", *written)  # what init wrote, nothing else that may be there
    run(*git, "commit", "-q", "-S", "-m", "Deployment repo made by reconciler init", "--trailer",
        f"{BRANCH_TRAILER}: {req.branch}")
    commit = run(*git, "rev-parse", "HEAD").strip()
    return Initialised(target, commit, signing_key, req.key is None, age_identity, req.age_identity is None,
                       recipient, req.email, req.node, req.branch)


def _NAME_OK(name: str) -> bool:  # noqa: N802 - reads as the rule it is
    import re

    return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", name) is not None


def files(name: str, node: str, email: str, signer_public: str, recipient: str) -> dict[str, str]:
    """The skeleton's files, repo path -> text."""
    return {
        "reconciler.yaml": RECONCILER_YAML.format(name=name),
        "inventory.yaml": INVENTORY.format(node=node),
        "services/hello/service.yaml": SERVICE,
        "services/hello/templates/hello.toml.j2": TEMPLATE,
        "services/hello/files/hello.py": HELLO_PY,
        "trust/allowed_signers": ALLOWED_SIGNERS.format(email=email, key=signer_public),
        "trust/nodes": TRUST_NODES,
        ".sops.yaml": SOPS_YAML.format(recipient=recipient),
    }


RECONCILER_YAML = """\
# The deployment's settings. Schema: reconciler/schema/reconciler.schema.json
format: 1
name: {name}
description: made by reconciler init
defaults:
  driver: process
  health_timeout: 15
"""

INVENTORY = """\
# Groups are roles: a group lists the services its nodes run. Variables, lowest to highest
# precedence: a service's defaults, vars here, each group's vars, a node's own vars.
# Schema: reconciler/schema/inventory.schema.json. Add a node with `reconciler node add NAME`.
vars:
  hello_port: 8080
  greeting: Hello from reconciler

groups:
  web:
    description: the nodes that run hello
    services: [hello]

nodes:
  {node}:
    groups: [web]
"""

SERVICE = """\
description: A small HTTP server, run by the process driver (replace it with your own services).
runtime:
  command: [python3, hello.py, --config, hello.toml]
files:
  - path: hello.toml
    template: hello.toml.j2
  - path: hello.py
    source: hello.py
health:
  http: "http://127.0.0.1:{{ hello_port }}/healthz"
"""

TEMPLATE = """\
# Rendered by reconciler for {{ node }}.
port = {{ hello_port }}
greeting = "{{ greeting }} ({{ node }})"
"""

HELLO_PY = '''\
"""A small HTTP server: GET / says the greeting of hello.toml, GET /healthz says ok.
SIGTERM stops it; the process driver restarts it when its files change."""

import argparse
import signal
import sys
import tomllib
from http.server import BaseHTTPRequestHandler, HTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--config", required=True)
config = tomllib.load(open(parser.parse_args().config, "rb"))


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"ok\\n" if self.path == "/healthz" else (config["greeting"] + "\\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
HTTPServer(("127.0.0.1", int(config["port"])), Handler).serve_forever()
'''

ALLOWED_SIGNERS = """\
# Who may sign the commits nodes apply (git's allowed-signers format; the principal is the
# committer's email). Each node's trust.allowed_signers starts as a copy of this file; a change
# here takes effect only from a commit signed by a key listed before it (a rotation).
{email} namespaces="git" {key}
"""

TRUST_NODES = """\
# Which key speaks for which node: one line per node (`reconciler node add NAME` writes it),
# NAME namespaces="reconciler-note" ssh-ed25519 AAAA...
"""

SOPS_YAML = """\
# Who can read which secrets file: sops reads this when it encrypts (reconciler never does).
# The operator's age recipient is in every rule, so the operator can edit and re-encrypt;
# `reconciler node add NAME` adds each node's.
creation_rules:
  - path_regex: secrets/.*\\.yaml$
    age: {recipient}
"""
