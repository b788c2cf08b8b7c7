"""The registry of driver kinds: what each kind of driver is and can do, declared as plain data.

A ``Kind`` says where its records live, how a node makes one, and its capabilities: the action a
config change no rule explains needs, what a service definition must have, whether it may ask
for a reboot, its default config dir, the checks it offers, and the optional work it does for
the agent (images pulled ahead, a reboot finished after boot, housekeeping between passes,
liveness for the supervisor). Code that used to name a driver ("docker", "host") asks the
registry for the capability instead, so a new kind is one ``register`` call and nothing else.

Pure on purpose: the planner, the render and the repo's checks read it, so nothing of a runtime
is imported here at module level; a kind's implementation is imported by its factory, when a
node makes one (the docker SDK only where a docker service runs). The four built-in kinds are
registered at the end of this module, in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from reconciler.core.errors import BadInput
from reconciler.core.model import ActionKind

if TYPE_CHECKING:
    from reconciler.core.model import DesiredService
    from reconciler.drivers.base import Driver, Unrecorded
    from reconciler.drivers.hostaccess import HostAccess
    from reconciler.drivers.registry import RegistryLogin

ACCOUNTS = "accounts"
"""A check a kind offers: its ``user`` and ``group`` are accounts of the node, resolved when the
node renders its slice (a name the node does not know fails the render, not the start)."""


@dataclass(frozen=True)
class DriverContext:
    """What a node gives every driver it makes."""

    state_root: Path
    node: str
    host: HostAccess
    logins: tuple[RegistryLogin, ...] = ()
    """Registry logins, for the kinds that pull images."""


@dataclass(frozen=True)
class Kind:
    """One kind of driver and its capabilities."""

    name: str
    state_dir: str
    """The sub-directory of the state root its records live in (one directory per service)."""
    make: Callable[[DriverContext, Path], Driver]
    """The driver for a node, given the context and its records' directory."""
    config_change: ActionKind = ActionKind.RESTART
    """The action a changed file that no ``on_change`` rule explains needs."""
    ceiling: ActionKind = ActionKind.RECREATE
    """``escalate_to`` when the service does not say."""
    needs_command: bool = True
    needs_image: bool = False
    absolute_paths: bool = False
    """Its files are paths on the node itself, not relative to a config dir."""
    may_reboot: bool = False
    """An ``on_change`` rule may ask for a reboot."""
    config_dir: str = ""
    """The default config dir (``{service}`` is the service's name); empty: none of its own."""
    checks: frozenset[str] = frozenset()
    """Checks the node makes when it renders a service of this kind (``ACCOUNTS``)."""
    prefetch: bool = False
    """Its services' images are pulled ahead, before anything is stopped (``Prefetching``)."""
    after_boot: bool = False
    """A change may end in a reboot that the agent finishes after boot (``FinishesReboot``)."""
    housekeeping: bool = False
    """The supervisor gives it a turn each tick (``Housekeeping``)."""
    supervised: bool = True
    """The supervisor reads its liveness each tick and revives what died."""
    steps_in_image: bool = False
    """An upgrade step's command runs in a one-off container of the service's new image."""
    always_in_use: bool = False
    """Observed on every pass, records or not (the default kind: cheap to read)."""
    adopts: bool = False
    """It finds its own instances without records (marker, labels) and takes them back
    (``Adopting``): a node that lost its state dir keeps what runs."""

    def default_config_dir(self, service: str) -> str:
        return self.config_dir.format(service=service)


class Prefetching(Protocol):
    def pull(self, image: str) -> bool:
        """The image on the node unless it is there already; True when it was pulled."""
        ...


class FinishesReboot(Protocol):
    def pending_reboot(self) -> dict[str, Any] | None: ...

    def boot_id(self) -> str: ...

    def finish_reboot(self, pending: dict[str, Any]) -> None: ...


class Housekeeping(Protocol):
    def housekeep(self) -> None:
        """Work between passes that keeps the node healthy (a service's logs rotated)."""
        ...


class Adopting(Protocol):
    def unrecorded(self) -> list[Unrecorded]:
        """This node's instances that run with no record of this driver's."""
        ...

    def adopt(self, svc: DesiredService, commit: str) -> int | None:
        """The instance found running for ``svc`` (same hash) recorded as this driver's own, with
        its files written; the instance itself untouched. Returns its pid."""
        ...


_KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> None:
    """Add a kind; a name already registered is a programming error."""
    if kind.name in _KINDS:
        raise ValueError(f"driver kind {kind.name!r} is registered already")
    _KINDS[kind.name] = kind


def unregister(name: str) -> None:
    _KINDS.pop(name, None)


def names() -> tuple[str, ...]:
    """The registered kinds, in the order they were registered."""
    return tuple(_KINDS)


def find(name: str | None) -> Kind | None:
    return _KINDS.get(name or "")


def prefetches(name: str | None) -> bool:
    """A service of this driver has images to pull ahead of its change (an unknown name: none)."""
    kind = find(name)
    return kind is not None and kind.prefetch


def kind_of(name: str) -> Kind:
    kind = _KINDS.get(name)
    if kind is None:
        raise BadInput(f"driver {name!r} is not known (known: {', '.join(names())})")
    return kind


def config_change(driver: str) -> ActionKind:
    """The default action of a config change for a service of ``driver``."""
    kind = find(driver)
    return kind.config_change if kind else ActionKind.RESTART


def ceiling(driver: str | None) -> ActionKind:
    """A service's ``escalate_to`` when it does not say, for ``driver`` (None: the default's)."""
    kind = find(driver)
    return kind.ceiling if kind else ActionKind.RECREATE


def prefetching(name: str, driver: Driver) -> Prefetching | None:
    """``driver`` as one that pulls ahead, None if its kind does not."""
    return cast("Prefetching", driver) if kind_of(name).prefetch else None


def finishes_reboot(name: str, driver: Driver) -> FinishesReboot | None:
    """``driver`` as one whose reboot the agent finishes after boot, None if its kind has none."""
    return cast("FinishesReboot", driver) if kind_of(name).after_boot else None


def housekeeping(name: str, driver: Driver) -> Housekeeping | None:
    return cast("Housekeeping", driver) if kind_of(name).housekeeping else None


def adopting(name: str, driver: Driver) -> Adopting | None:
    """``driver`` as one that finds and takes back its own instances, None if its kind does not."""
    return cast("Adopting", driver) if kind_of(name).adopts else None


# The built-in kinds ----------------------------------------------------------------------
def _process(ctx: DriverContext, root: Path) -> Driver:
    from reconciler.drivers.process import ProcessDriver

    return ProcessDriver(root, ctx.node)


def _docker(ctx: DriverContext, root: Path) -> Driver:
    from reconciler.drivers.docker import DockerDriver  # the docker SDK is imported only where it is used

    return DockerDriver(root, ctx.node, logins=ctx.logins)


def _systemd(ctx: DriverContext, root: Path) -> Driver:
    from reconciler.drivers.systemd import SystemdDriver

    return SystemdDriver(root, ctx.node, ctx.host)


def _host(ctx: DriverContext, root: Path) -> Driver:
    from reconciler.drivers.host import HostDriver

    return HostDriver(root, ctx.node, ctx.host)


for _kind in (
    Kind("process", "services", _process, checks=frozenset({ACCOUNTS}), housekeeping=True, always_in_use=True,
         adopts=True),
    Kind("docker", "docker", _docker, needs_command=False, needs_image=True, config_dir="/etc/{service}",
         prefetch=True, steps_in_image=True, adopts=True),
    Kind("systemd", "systemd", _systemd),
    Kind("host", "host", _host, config_change=ActionKind.REBOOT, ceiling=ActionKind.REBOOT, needs_command=False,
         absolute_paths=True, may_reboot=True, after_boot=True),
):
    register(_kind)
