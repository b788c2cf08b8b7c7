"""kolla-ansible's filters ``customise_fluentd`` and ``database_shards_info`` in the Ansible
dialect, held to kolla's own code (``kolla_ansible/fluentd_filters.py`` and ``database_shards.py``
of the pinned release's wheel, loaded from it) on generated inputs: the same result, or both
refuse (ours with a RenderError)."""

from __future__ import annotations

import posixpath
import sys
import types
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_import_kolla import kolla_wheel  # noqa: F401 - the session's wheel

from reconciler.core.errors import RenderError
from reconciler.render.environment import service_environment
from reconciler.render.kolla_filters import customise_fluentd, database_shards_info

FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                      HealthCheck.function_scoped_fixture])
KOLLA_MODULES = ("exception", "helpers", "fluentd_filters", "database_shards")


@pytest.fixture(scope="module")
def kolla(kolla_wheel: Path) -> Iterator[dict[str, Callable[..., Any]]]:  # noqa: F811
    """kolla's filter functions, their modules run from the wheel's source (the package's
    ``__init__`` wants pbr, which is not installed here, and is not needed)."""
    package = types.ModuleType("kolla_ansible")
    package.__path__ = []
    added = {"kolla_ansible": package}
    sys.modules["kolla_ansible"] = package
    try:
        with zipfile.ZipFile(kolla_wheel) as whl:
            for name in KOLLA_MODULES:
                module = types.ModuleType(f"kolla_ansible.{name}")
                added[module.__name__] = sys.modules[module.__name__] = module
                exec(compile(whl.read(f"kolla_ansible/{name}.py"), f"kolla_ansible/{name}.py", "exec"),  # noqa: S102
                     module.__dict__)
        yield {"customise_fluentd": added["kolla_ansible.fluentd_filters"].customise_fluentd,
               "database_shards_info": added["kolla_ansible.database_shards"].database_shards_info}
    finally:
        for name in added:
            sys.modules.pop(name, None)


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", call()
    except RenderError:
        return "refused", None
    except Exception:  # noqa: BLE001 - kolla's FilterError, or Python's own on a bad input
        return "refused", None


paths = st.lists(st.builds(lambda d, n, ext: f"{d}{n}{ext}", st.sampled_from(["", "/etc/kolla/", "conf/input/",
                                                                             "a/b/"]),
                           st.sampled_from(["00-local", "01-syslog", "02-mariadb", "x.y", "conf"]),
                           st.sampled_from(["", ".conf", ".conf.j2", ".j2"])), max_size=6)


@FEW
@given(paths, paths)
def test_customise_fluentd_is_kollas(kolla: dict[str, Callable[..., Any]], defaults: list[str],
                                     customised: list[str]) -> None:
    theirs = kolla["customise_fluentd"](defaults, customised)
    ours = customise_fluentd(defaults, customised)
    # kolla leaves two paths of one base name in a set's order; ours breaks the tie by path.
    assert ours == sorted(sorted(theirs), key=posixpath.basename)
    assert [posixpath.basename(p) for p in ours] == [posixpath.basename(p) for p in theirs]


def test_customise_fluentd_renders_in_the_dialect(kolla: dict[str, Callable[..., Any]]) -> None:
    env = service_environment({"t": "{{ d | customise_fluentd(c) | join(',') }}"}, "s", "ansible")
    out = env.get_template("t").render(d=["in/00-local.conf.j2", "in/01-syslog.conf.j2"], c=["/cfg/00-local.conf"])
    assert out == "/cfg/00-local.conf,in/01-syslog.conf.j2"


host = st.fixed_dictionaries({}, optional={
    "mariadb_shard_id": st.one_of(st.integers(0, 2), st.sampled_from(["0", "1"]), st.none()),
    "enable_mariabackup": st.sampled_from(["yes", "no", True, False, "maybe", None]),
    "database_password": st.sampled_from(["pw-a", "pw-b", None]),
    "mariadb_shard_root_user_prefix": st.sampled_from(["root_shard_", None]),
    "mariadb_shard_backup_user_prefix": st.sampled_from(["backup_shard_", None]),
    "mariadb_backup_database_password": st.sampled_from(["bk", None]),
})


@FEW
@given(st.dictionaries(st.sampled_from(["db1", "db2", "db3", "db4"]), host, max_size=4),
       st.lists(st.sampled_from(["db1", "db2", "db3", "db4", "gone"]), max_size=5))
def test_database_shards_info_is_kollas(kolla: dict[str, Callable[..., Any]], hostvars: dict[str, Any],
                                        hostnames: list[str]) -> None:
    # Both read Ansible's ``bool`` through the same environment (the dialect's, held to
    # ansible-core in test_ansible_dialect.py).
    env = service_environment({}, "s", "ansible")
    ctx = env.from_string("").new_context({"hostvars": hostvars})
    theirs = _outcome(lambda: kolla["database_shards_info"](ctx, hostnames))
    ours = _outcome(lambda: database_shards_info(ctx, hostnames))
    assert ours == theirs


def test_database_shards_info_renders_kollas_group_var(tmp_path: Path) -> None:
    env = service_environment({"t": "{% set i = groups['mariadb'] | database_shards_info() %}"
                                    "{{ i.shards | to_json }} {{ i.users | map(attribute='user') | join(',') }}"},
                              "s", "ansible")
    hostvars = {n: {"mariadb_shard_id": shard, "enable_mariabackup": "yes", "database_password": "pw",
                    "mariadb_shard_root_user_prefix": "root_shard_", "mariadb_shard_backup_user_prefix": "backup_shard_",
                    "mariadb_backup_database_password": "bk"} for n, shard in (("a", 0), ("b", 0), ("c", 1))}
    out = env.get_template("t").render(groups={"mariadb": ["a", "b", "c"]}, hostvars=hostvars)
    assert out == ('{"0": {"hosts": ["a", "b"]}, "1": {"hosts": ["c"]}} '
                   "root_shard_0,backup_shard_0,root_shard_1,backup_shard_1")
