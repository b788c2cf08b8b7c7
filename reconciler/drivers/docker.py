"""Services as containers on a Docker engine, through its API.

Every container carries labels (node, service, commit, spec hash, config hash) and only
containers labelled with this node are ever read or touched. Rendered files are bind-mounted
read-only from ``<state>/docker/<service>/live``, a directory changed in place file by file, so
the container sees new files at once: a reload is a signal (through docker's init) or a
command run inside; a config-only change is a restart of the same container; a spec change
(image, command, ports...) is a new container. The old files, or the old container, come back
if the new version fails its check.

Per service, ``<state>/docker/<service>/record.json`` holds what the agent last applied
(labels are fixed at creation and cannot say that a restart brought new files). A node that
lost its state dir finds its containers by label and takes them back, left running (``adopt``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from reconciler.core import faults
from reconciler.core.errors import ApplyError, ReconcilerError
from reconciler.core.model import DesiredService, ObservedService
from reconciler.drivers import dockerback, dockernet
from reconciler.drivers.base import Check, Unrecorded
from reconciler.drivers.dockerengine import PREFIX, STOP_TIMEOUT, EngineDown, connect, pull
from reconciler.drivers.dockerspec import create_args
from reconciler.drivers.files import read_dir, read_record, sync_dir, write_record
from reconciler.drivers.registry import PullFailed, RegistryLogin


class DockerDriver:
    name = "docker"

    def __init__(self, root: Path, node: str, client: docker.DockerClient | None = None,
                 logins: Iterable[RegistryLogin] = ()) -> None:
        self.root = root
        self.node = node
        self._client = client
        self.logins = {login.registry: login for login in logins}

    # engine --------------------------------------------------------------------------
    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = connect(self.node)
        return self._client

    def container_name(self, service: str) -> str:
        return f"rc-{self.node}-{service}"

    def _container(self, service: str) -> Container | None:
        try:
            c = self.client.containers.get(self.container_name(service))
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as exc:
            raise EngineDown(f"node {self.node}: docker engine error: {exc.explanation}") from exc
        return c if c.labels.get(PREFIX + "node") == self.node else None  # never touch what is not ours

    # records -------------------------------------------------------------------------
    def _dir(self, service: str) -> Path:
        return self.root / service

    def _record(self, service: str) -> dict[str, Any] | None:
        return read_record(self._dir(service))

    def _write_record(self, svc: DesiredService, commit: str, container: Container) -> None:
        rec = {"service": svc.name, "hash": svc.hash, "fingerprint": svc.fingerprint(), "commit": commit,
               "container": container.id, "networks": sorted(svc.runtime.networks),
               "network_mode": svc.runtime.network_mode, "drift": svc.drift,
               "aliases": {n: list(dockernet.aliases(svc.runtime, n)) for n in svc.runtime.networks},
               "restart": svc.runtime.restart or "no", "config_hash": svc.config_hash}
        write_record(self._dir(svc.name), rec)

    def _live(self, service: str) -> Path:
        return self._dir(service) / "live"

    # observe ---------------------------------------------------------------------------
    def liveness(self) -> list[ObservedService]:
        return self.observe(files=False)  # one query of the engine, as observe's

    def _labelled(self) -> list[tuple[str, Container]]:
        """This node's containers, by service (not one set aside by an interrupted recreate:
        the next recreate removes it)."""
        try:
            containers = self.client.containers.list(all=True, filters={"label": f"{PREFIX}node={self.node}"})
        except docker.errors.APIError as exc:
            raise EngineDown(f"node {self.node}: docker engine error: {exc.explanation}") from exc
        return [(name, c) for c in containers
                if (name := c.labels.get(PREFIX + "service", "")) and c.name == self.container_name(name)]

    def observe(self, *, files: bool = True) -> list[ObservedService]:
        out = [self._observed(name, c, files) for name, c in self._labelled()]
        found = {o.name for o in out}
        if self.root.is_dir():
            for d in sorted(self.root.iterdir()):
                rec = self._record(d.name)
                if rec is not None and d.name not in found:
                    out.append(ObservedService(
                        name=d.name, driver=self.name, running=False, hash=rec["hash"], commit=rec["commit"],
                        detail="container removed by hand", fingerprint=tuple(sorted(rec["fingerprint"].items())),
                    ))
        return sorted(out, key=lambda o: o.name)

    def unrecorded(self) -> list[Unrecorded]:
        """This node's containers with no record here (the state dir was lost), as labelled."""
        return [Unrecorded(name, c.labels.get(PREFIX + "hash", ""), c.labels.get(PREFIX + "commit", ""),
                           int(c.attrs.get("State", {}).get("Pid") or 0) or None)
                for name, c in self._labelled() if self._record(name) is None]

    def adopt(self, svc: DesiredService, commit: str) -> int | None:
        """``svc``'s container recorded, its files written again (seen from its next start); untouched."""
        c = self._container(svc.name)
        if c is None or c.labels.get(PREFIX + "hash") != svc.hash:
            raise ApplyError(f"node {self.node}, service {svc.name}: no container of version {svc.hash[:12]} to adopt")
        sync_dir(self._live(svc.name), svc.files)
        self._write_record(svc, commit, c)
        return self._pid(c)

    def _observed(self, name: str, c: Container, files: bool = True) -> ObservedService:
        rec = self._record(name)
        labels = c.labels
        ours = rec is not None and rec.get("container") == c.id
        fingerprint = rec["fingerprint"] if ours and rec else json.loads(labels.get(PREFIX + "fingerprint", "{}"))
        state = c.attrs.get("State", {})
        drifted = ""
        if ours and rec is not None:
            networks = sorted(c.attrs.get("NetworkSettings", {}).get("Networks", {}) or {})
            wanted = sorted(rec["networks"]) or [rec.get("network_mode") or "bridge"]
            policy = (c.attrs.get("HostConfig", {}).get("RestartPolicy") or {}).get("Name") or "no"
            if networks != wanted:
                drifted = "networks"
            elif policy != rec["restart"]:
                drifted = "restart policy"
        running = c.status == "running"
        return ObservedService(
            name=name, driver=self.name, running=running,
            hash=rec["hash"] if ours and rec else labels.get(PREFIX + "hash"),
            commit=rec["commit"] if ours and rec else labels.get(PREFIX + "commit"),
            pid=int(state.get("Pid") or 0) or None,
            detail="" if running else f"container {c.status} (exit code {state.get('ExitCode')})",
            fingerprint=tuple(sorted(fingerprint.items())), drifted=drifted,
            files=read_dir(self._live(name)) if files else (),
            drift=str(rec.get("drift", "correct")) if rec else "correct",
        )

    def running(self, name: str) -> bool:
        c = self._container(name)
        if c is None:
            return False
        c.reload()
        return bool(c.status == "running")

    def native_health(self, name: str) -> str | None:
        c = self._container(name)
        if c is None:
            return None
        health = c.attrs.get("State", {}).get("Health")
        return str(health["Status"]) if health else None

    def run_check(self, name: str, command: str) -> bool:
        c = self._container(name)
        if c is None:
            return False
        try:
            result = c.exec_run(["/bin/sh", "-c", command])
        except docker.errors.APIError:
            return False
        return bool(result.exit_code == 0)

    def logs(self, name: str, lines: int, follow: bool) -> Iterator[bytes]:
        c = self._container(name)
        if c is None:
            return iter(())
        try:
            if follow:
                return iter(c.logs(tail=lines, stream=True, follow=True))
            return iter((c.logs(tail=lines),))
        except docker.errors.APIError as exc:
            raise EngineDown(f"node {self.node}: docker engine error: {exc.explanation}") from exc

    def last_output(self, name: str, lines: int = 5) -> str:
        c = self._container(name)
        if c is None:
            return ""
        try:
            text = c.logs(tail=lines).decode(errors="replace")
        except docker.errors.APIError:
            return ""
        return " | ".join(t.strip() for t in text.splitlines() if t.strip())

    # images ----------------------------------------------------------------------------
    def pull(self, image: str) -> bool:
        """Pull ``image`` unless the engine has it already; True when it was pulled."""
        return pull(self.client, self.node, self.logins, image)

    def _pull_first(self, svc: DesiredService) -> None:
        """Before anything of the running version is stopped: the new image on the engine, or
        a failed change that left the service as it was."""
        try:
            self.pull(svc.runtime.image)
        except PullFailed as exc:
            raise PullFailed(f"node {self.node}, service {svc.name}: {exc}; nothing was stopped for it",
                             reason=exc.reason) from None

    # apply -----------------------------------------------------------------------------
    def _create(self, svc: DesiredService, commit: str) -> Container:
        rt = svc.runtime  # its image is on the engine: start and recreate pull it first
        dockernet.ensure(self.client, self.node, rt.networks)
        try:
            c = self.client.containers.create(**create_args(
                self.client, svc, self.node, commit, self._live(svc.name), self.container_name(svc.name)))
            for net in rt.networks[1:]:
                self.client.networks.get(net).connect(c, aliases=list(dockernet.aliases(rt, net)) or None)
            c.start()
        except docker.errors.APIError as exc:
            with contextlib.suppress(docker.errors.APIError, UnboundLocalError):
                c.remove(force=True)
            raise ApplyError(f"node {self.node}, service {svc.name}: {exc.explanation or exc}") from exc
        c.reload()
        self._write_record(svc, commit, c)
        return c

    def _pid(self, c: Container) -> int | None:
        c.reload()
        return int(c.attrs.get("State", {}).get("Pid") or 0) or None

    def start(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        self._pull_first(svc)
        old = self._container(svc.name)
        if old is not None:  # stopped, crashed or changed by hand: start clean from the spec
            old.remove(force=True)
        sync_dir(self._live(svc.name), svc.files)
        c = self._create(svc, commit)
        try:
            check()
        except ReconcilerError:
            # Nothing to go back to: remove it, so neither the engine's restart policy nor the
            # supervisor brings the failed version back; the next run starts it afresh.
            with contextlib.suppress(docker.errors.APIError):
                c.remove(force=True)
            (self._dir(svc.name) / "record.json").unlink(missing_ok=True)
            raise
        return self._pid(c)

    def restart(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        c = self._container(svc.name)
        if c is None:
            return self.start(svc, commit, check)
        was = dockerback.before(c, self._dir(svc.name))
        try:  # a refused connect too (no free address): files, networks and record put back
            sync_dir(self._live(svc.name), svc.files)
            dockernet.sync(self.client, self.node, c, svc)
            c.restart(timeout=STOP_TIMEOUT)
            check()
        except ReconcilerError as exc:
            said = dockerback.put_back(self.client, c, was, lambda c: c.restart(timeout=STOP_TIMEOUT),
                                       f"container {c.short_id} restarted")
            raise ApplyError(f"{exc}; {said}") from exc
        self._write_record(svc, commit, c)
        return self._pid(c)

    def recreate(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        old = self._container(svc.name)
        if old is None:
            return self.start(svc, commit, check)
        self._pull_first(svc)  # the old container keeps serving until the new image is here
        previous = self._record(svc.name)
        self._remove_leftovers(svc.name)
        aside = f"{self.container_name(svc.name)}-old-{int(time.time())}"
        faults.point("stop", old.name)
        old.stop(timeout=STOP_TIMEOUT)
        old.rename(aside)
        before = read_dir(self._live(svc.name))
        sync_dir(self._live(svc.name), svc.files)
        try:
            new = self._create(svc, commit)
            check()
        except ReconcilerError as exc:
            with contextlib.suppress(docker.errors.APIError):
                self.client.containers.get(self.container_name(svc.name)).remove(force=True)
            sync_dir(self._live(svc.name), before)
            old.rename(self.container_name(svc.name))
            old.start()
            if previous is not None:
                write_record(self._dir(svc.name), previous)
            raise ApplyError(f"{exc}; previous container restored ({old.short_id})") from exc
        old.remove(force=True)
        return self._pid(new)

    def reload(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        c = self._container(svc.name)
        if c is None or c.status != "running":
            raise ApplyError(f"node {self.node}, service {svc.name}: not running, nothing to reload")
        was = dockerback.before(c, self._dir(svc.name))
        try:  # a refused connect too (no free address): files, networks and record put back
            sync_dir(self._live(svc.name), svc.files)  # the bind-mounted dir: the container sees it now
            dockernet.sync(self.client, self.node, c, svc)
            self._signal_reload(c, svc)
            check()
        except ReconcilerError as exc:
            said = dockerback.put_back(self.client, c, was, lambda c: self._signal_reload(c, svc), "reloaded")
            raise ApplyError(f"{exc}; {said}") from exc
        self._write_record(svc, commit, c)
        return self._pid(c)

    def _signal_reload(self, c: Container, svc: DesiredService) -> None:
        try:
            if svc.reload.command:
                result = c.exec_run(["/bin/sh", "-c", svc.reload.command])
                if result.exit_code != 0:
                    out = result.output.decode(errors="replace")[-200:]
                    raise ApplyError(f"node {self.node}, service {svc.name}: reload command failed: {out}")
            else:
                c.kill(signal=svc.reload.signal)  # PID 1 is docker's init: it passes the signal on
        except docker.errors.APIError as exc:
            raise ApplyError(f"node {self.node}, service {svc.name}: reload: {exc.explanation or exc}") from exc

    def update(self, svc: DesiredService, commit: str) -> None:
        c = self._container(svc.name)
        sync_dir(self._live(svc.name), svc.files)
        if c is not None:
            self._write_record(svc, commit, c)

    def _remove_leftovers(self, service: str) -> None:
        """Containers of this service set aside by a recreate whose restore was interrupted."""
        flt = {"label": [f"{PREFIX}node={self.node}", f"{PREFIX}service={service}"]}
        for c in self.client.containers.list(all=True, filters=flt):
            if c.name != self.container_name(service):
                with contextlib.suppress(docker.errors.APIError):
                    c.remove(force=True)

    def connect(self, svc: DesiredService, commit: str, check: Check | None = None) -> None:
        """Networks changed alone: joined and left live, the same container running on. When
        the service fails its check on its new networks (a VIP taken over by a control plane
        that does not work), the networks it had come back."""
        c = self._container(svc.name)
        if c is None:
            raise ApplyError(f"node {self.node}, service {svc.name}: no container to connect")
        was = dockerback.before(c, self._dir(svc.name))
        try:  # a refused connect too (no free address): off it again, then back where it was
            dockernet.sync(self.client, self.node, c, svc)
            sync_dir(self._live(svc.name), svc.files)
            if check is not None:
                check()
        except ReconcilerError as exc:
            raise ApplyError(f"{exc}; {dockerback.put_back(self.client, c, was, None)}") from exc
        self._write_record(svc, commit, c)

    def stop(self, name: str) -> None:
        c = self._container(name)
        if c is not None:
            c.stop(timeout=STOP_TIMEOUT)

    def remove(self, name: str) -> None:
        c = self._container(name)
        if c is not None:
            c.remove(force=True)
        d = self._dir(name)
        for p in ("record.json",):
            with contextlib.suppress(FileNotFoundError):
                (d / p).unlink()
        shutil.rmtree(d / "live", ignore_errors=True)
        dockernet.prune(self.client, self.node)

    def revive(self, name: str) -> int | None:
        c = self._container(name)
        if c is None:
            raise ApplyError(f"node {self.node}, service {name}: container is gone; the next run recreates it")
        c.reload()
        # never onto a network its record does not name (a leftover a start would join)
        why = dockernet.revive(self.client, c, dockernet.recorded(self._record(name), dockernet.attached(c)))
        if why:
            raise ApplyError(f"node {self.node}, service {name}: container {c.name} {why}")
        return self._pid(c)
