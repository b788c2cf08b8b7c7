"""Issue 40's first deploy: 30 independent services onto an empty node, reconciler beside
ansible-playbook doing the same work in the same run, the runs of each taken in turns.

The work, for each of ``--services`` services: a file rendered from a template, a process started
(``python3 -m http.server`` on a port of its own) and its health waited for (the port answers).

- reconciler: ``reconciler agent --once`` on a fresh state dir, a signed repo of those services
  (``health: {tcp: ...}``, the default ``min_healthy`` hold of 0.5 s), at the node's default
  ``max_parallel`` and at ``max_parallel: 1`` (one after another, as before the setting);
- ansible-playbook (ansible-core 2.19, its own venv: ``bench/peers.py``; no fact gathering, local
  connection: its best case), as such a playbook is written: a ``template`` loop, a loop that
  starts each process, a ``wait_for`` loop on the ports. It holds nothing after the port opens.

Each run starts from nothing (its services stopped after it). Printed: wall time and CPU (the
process and what it waited for; not the services' own) per tool, medians of ``--runs``, and the
ratio of wall times.

    .venv/bin/python bench/deploy.py [--services 30] [--runs 3] [--before DIR]

``--before DIR``: another checkout's package (``DIR/reconciler``, e.g. the commit before a change
to the apply) run at the default width in the same turns, printed beside this one.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchrepo import ENV, make_key, signed_remote  # noqa: E402
from peers import ANSIBLE, _clean_env, load, venv  # noqa: E402

SERVICE = """\
runtime:
  command: [python3, -m, http.server, "{{ ports[service] }}", --bind, 127.0.0.1]
files:
  - {path: app.conf, template: app.conf.j2}
health:
  tcp: "127.0.0.1:{{ ports[service] }}"
  timeout: 30
"""
TEMPLATE = "name = {{ service }}\nport = {{ ports[service] }}\n"
PLAY = """\
- hosts: localhost
  gather_facts: false
  connection: local
  vars:
    root: "{root}"
    services: {services}
  tasks:
    - ansible.builtin.file: {{path: "{{{{ root }}}}/{{{{ item.name }}}}", state: directory}}
      loop: "{{{{ services }}}}"
    - ansible.builtin.template: {{src: app.conf.j2, dest: "{{{{ root }}}}/{{{{ item.name }}}}/app.conf"}}
      loop: "{{{{ services }}}}"
    - ansible.builtin.shell: >-
        cd {{{{ root }}}}/{{{{ item.name }}}} &&
        setsid nohup python3 -m http.server {{{{ item.port }}}} --bind 127.0.0.1 >service.log 2>&1 </dev/null &
      loop: "{{{{ services }}}}"
    - ansible.builtin.wait_for: {{port: "{{{{ item.port }}}}", host: 127.0.0.1, timeout: 30}}
      loop: "{{{{ services }}}}"
"""


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports nothing listens on now."""
    import socket

    held = [socket.socket() for _ in range(count)]
    try:
        for s in held:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


HOLD = 0.5  # the default min_healthy the services are held for


def start_time(root: Path, port: int) -> float:
    """How long one service takes to answer on its port once started (the "slowest start" of
    the target: every service here is the same program)."""
    import socket

    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return time.monotonic() - t0
            except OSError:
                time.sleep(0.005)
    finally:
        proc.kill()
        proc.wait()


def timed(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, float]:
    """Wall and CPU seconds of ``cmd`` (its processes that it waited for included)."""
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def stop_listeners(ports: list[int]) -> None:
    """Every process serving one of ``ports`` (whoever started it), stopped: the next run
    starts from nothing."""
    wanted = {f"{p:04X}" for p in ports}
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] == "0A" and parts[1].rsplit(":", 1)[1] in wanted:
                inodes.add(parts[9])
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if any(f.startswith("socket:[") and f[8:-1] in inodes for f in fds):
            os.kill(int(entry.name), signal.SIGKILL)


def repo(root: Path, names: list[str], ports: list[int]) -> tuple[str, Path]:
    """The signed remote of the services, and the allowed signers file."""
    key, allowed = make_key(root)
    work, bare = root / "work", root / "remote.git"
    files = {
        "reconciler.yaml": "format: 1\nname: deploy\n",
        "inventory.yaml": "vars:\n  ports: {" + ", ".join(f"{n}: {p}" for n, p in zip(names, ports, strict=True))
                          + "}\ngroups:\n  all:\n    services: [" + ", ".join(names) + "]\n"
                          "nodes:\n  bench1:\n    groups: [all]\n",
    }
    for n in names:
        files[f"services/{n}/service.yaml"] = SERVICE
        files[f"services/{n}/templates/app.conf.j2"] = TEMPLATE
    signed_remote(work, bare, files, key, "deploy")
    return f"file://{bare}", allowed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--services", type=int, default=30)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-peer", action="store_true", help="reconciler's runs only (a quick look)")
    ap.add_argument("--before", type=Path, help="a checkout whose reconciler/ runs at the default width beside")
    args = ap.parse_args()
    from reconciler.settings import AgentConfig

    widths = {"default": AgentConfig.max_parallel, "all": args.services, "seq": 1}
    modes = [*widths, *(["before"] if args.before else []), *([] if args.no_peer else ["ansible"])]
    ansible = venv("ansible", ANSIBLE)
    names = [f"s{i:02d}" for i in range(args.services)]
    ports = free_ports(args.services)
    reconciler = [sys.executable, "-m", "reconciler"]
    runs: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    starts: list[float] = []
    with tempfile.TemporaryDirectory(prefix="reconciler-deploy-") as tmp:
        root = Path(tmp)
        url, allowed = repo(root, names, ports)
        configs = {}
        for mode, width in [*widths.items(), ("before", widths["default"])]:
            configs[mode] = root / f"{mode}.yaml"
            configs[mode].write_text(f"max_parallel: {width}\n")
        play = root / "play"
        play.mkdir()
        (play / "app.conf.j2").write_text(TEMPLATE.replace("ports[service]", "item.port").replace("service", "item.name"))
        services = "[" + ", ".join(f"{{name: {n}, port: {p}}}" for n, p in zip(names, ports, strict=True)) + "]"
        (play / "deploy.yml").write_text(PLAY.format(root=root / "ansible-root", services=services))
        aenv = {**_clean_env(), "ANSIBLE_PYTHON_INTERPRETER": str(ansible / "python"), "ANSIBLE_NOCOLOR": "1"}
        try:
            for k in range(args.runs):
                starts.append(start_time(root, ports[0]))
                for mode in modes:
                    if mode == "ansible":
                        runs[mode].append(timed([str(ansible / "ansible-playbook"), "-i", "localhost,", "deploy.yml"],
                                                aenv, cwd=play))
                    else:
                        state = root / f"state-{mode}-{k}"
                        runs[mode].append(timed([*reconciler, "agent", "--once", "--config", str(configs[mode]),
                                                 "--node", "bench1", "--remote", url, "--state-dir", str(state),
                                                 "--allowed-signers", str(allowed)], {**ENV, **_clean_env()},
                                                cwd=args.before if mode == "before" else None))
                    stop_listeners(ports)
        finally:
            stop_listeners(ports)

    def med(mode: str, i: int) -> float:
        return statistics.median(r[i] for r in runs[mode])

    start = statistics.median(starts)
    print(f"first deploy of {args.services} independent services (templated file, process, health), "
          f"medians of {args.runs}, load {load()}")
    for mode, width in widths.items():
        print(f"  reconciler, max_parallel {width:<3} {med(mode, 0):7.2f} s wall, {med(mode, 1):5.2f} s CPU")
    if args.before:
        print(f"  {args.before}, max_parallel {widths['default']}: {med('before', 0):7.2f} s wall, "
              f"{med('before', 1):5.2f} s CPU")
    bound = 3 + start + HOLD
    print(f"  target: at most 3 s + the slowest start ({start:.2f} s) and hold ({HOLD:g} s) = {bound:.2f} s: "
          f"max_parallel {widths['all']} {'met' if med('all', 0) <= bound else 'not met'}, "
          f"max_parallel {widths['default']} {'met' if med('default', 0) <= bound else 'not met'}")
    if "ansible" in runs:
        print(f"  ansible-playbook              {med('ansible', 0):7.2f} s wall, {med('ansible', 1):5.2f} s CPU")
        for mode, width in widths.items():
            print(f"  ansible-playbook / reconciler at max_parallel {width}: {med('ansible', 0) / med(mode, 0):.1f}x wall, "
                  f"{med('ansible', 1) / med(mode, 1):.1f}x CPU" + (" (target: at least 10x wall)" if mode != "seq" else ""))


if __name__ == "__main__":
    main()
