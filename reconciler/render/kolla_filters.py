"""kolla-ansible's own filters that its role variables call, beside the address filters of
``ansible_extras``, each as kolla-ansible 22.2.0 computes it (``kolla_ansible/fluentd_filters.py``,
``kolla_ansible/database_shards.py``); tests/test_kolla_filters.py holds them to that code.

- ``customise_fluentd(default_paths, customised_paths)``: fluentd's config parts, a default one
  dropped where an override of the same name (without ``.j2``) is given, sorted by base name
  (then by path: kolla leaves two of one base name in a set's order, not the same every run).
- ``database_shards_info(hostnames)``: MariaDB's shards from each host's ``mariadb_shard_id``
  (read through ``hostvars``, as ``kolla_address`` reads it), with the root user of each shard
  and, where ``enable_mariabackup`` is true (Ansible's ``bool``), its backup user.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jinja2

from reconciler.render.ansible_dialect import refuse


def customise_fluentd(default_paths: Iterable[Any], customised_paths: Iterable[Any]) -> list[Any]:
    customised = list(customised_paths)
    names = {posixpath.basename(f) for f in customised}
    result = {f for f in default_paths if posixpath.splitext(posixpath.basename(f))[0] not in names}
    result.update(customised)
    # kolla sorts by base name alone, so two paths of one base name come in the set's order,
    # which changes with the process's hash seed: here by path next, the same on every run.
    return sorted(sorted(result), key=posixpath.basename)


# A node reads no peer's secrets through ``hostvars`` (they render without ``secrets``): these
# passwords, deployment-wide in kolla (passwords.yml), are the node's own where a peer's is not there.
_PASSWORDS = frozenset({"database_password", "mariadb_backup_database_password"})


def _host_value(ctx: jinja2.runtime.Context, host: Mapping[str, Any], key: str) -> Any:
    value = host.get(key)
    if (value is None or isinstance(value, jinja2.Undefined)) and key in _PASSWORDS:
        value = ctx.get(key)
    return None if isinstance(value, jinja2.Undefined) else value


@jinja2.pass_context
def database_shards_info(ctx: jinja2.runtime.Context, hostnames: Iterable[Any]) -> dict[str, Any]:
    hostvars = ctx.get("hostvars")
    if not isinstance(hostvars, Mapping):
        raise refuse("database_shards_info", "'hostvars' variable is unavailable")
    shards: dict[str, dict[str, list[Any]]] = {}
    users: list[dict[str, Any]] = []
    for hostname in hostnames:
        host = hostvars.get(hostname)
        if not isinstance(host, Mapping):
            raise refuse("database_shards_info", f"'{hostname}' not in 'hostvars'")
        shard = _host_value(ctx, host, "mariadb_shard_id")
        if shard is None:
            raise refuse("database_shards_info", f"'mariadb_shard_id' is undefined for host '{hostname}'")
        shard = str(shard)
        if shard in shards:
            shards[shard]["hosts"].append(hostname)
            continue
        shards[shard] = {"hosts": [hostname]}
        wanted = {k: _host_value(ctx, host, k) for k in ("enable_mariabackup", "database_password",
                                                    "mariadb_shard_root_user_prefix")}
        for key, value in wanted.items():
            if value is None:
                raise refuse("database_shards_info", f"'{key}' variable is unavailable")
        backup = ctx.environment.call_filter("bool", wanted["enable_mariabackup"], context=ctx)
        users.append({"password": wanted["database_password"],
                      "user": f"{wanted['mariadb_shard_root_user_prefix']}{shard}", "shard_id": shard})
        if backup:
            prefix = _host_value(ctx, host, "mariadb_shard_backup_user_prefix")
            if prefix is None:
                raise refuse("database_shards_info", "'mariadb_shard_backup_user_prefix' variable is unavailable")
            users.append({"password": _host_value(ctx, host, "mariadb_backup_database_password"),
                          "user": f"{prefix}{shard}", "shard_id": shard})
    return {"shards": shards, "users": users}


KOLLA_FILTERS: dict[str, Callable[..., Any]] = {"customise_fluentd": customise_fluentd,
                                                "database_shards_info": database_shards_info}
