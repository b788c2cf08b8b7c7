"""What kolla's config tasks set that the import can know: a template task looping over a list
written out (one task per item), the ``service`` entry a task picks, a ``set_fact`` of a value
written out, and a result a role computes with a program of its own, computed in the dialect."""

from __future__ import annotations

import re
from typing import Any

from reconciler.importers.kolla_resolve import templated
from reconciler.importers.kolla_roles import TEMPLATE_MODULES

# What a role's task computes with a program of the role's own, computed here in the dialect:
# keystone's cron_jobs, from files/fernet_rotate_cron_generator.py (its arithmetic as it is,
# the day branch's ``hour = time % 60`` included) for this node's place among the keystone hosts.
TASK_RESULTS: dict[str, dict[str, str]] = {"keystone": {
    "cron_jobs": "{{ fernet_cron_jobs_json | from_json }}",
    "fernet_cron_jobs_json": (
        "{%- set total = (fernet_key_rotation_interval | int) // 60 -%}"
        "{%- set per = total * (groups['keystone'] | length) -%}"
        "{%- set off = total * groups['keystone'].index(inventory_hostname) -%}"
        # kolla's RotationIntervalTooLong: a node with no job would never rotate its keys.
        "{%- if total > 10080 -%}{{ fernet_rotation_interval_too_long | mandatory('fernet_key_rotation_interval: "
        "unable to schedule fernet key rotation with an interval greater than 1 week divided by the number of "
        "hosts (kolla-ansible refuses it too)') }}{%- endif -%}"
        "{%- set ns = namespace(jobs=[]) -%}"
        "{%- if per > 1440 -%}{%- for t in range(off, 10080 - total + 1, per) -%}"
        "{%- set ns.jobs = ns.jobs + [{'min': t % 60, 'hour': t % 60, 'day': t // 1440}] -%}{%- endfor -%}"
        "{%- elif per > 60 -%}{%- for t in range(off, 1440 - total + 1, per) -%}"
        "{%- set ns.jobs = ns.jobs + [{'min': t % 60, 'hour': t // 60, 'day': '*'}] -%}{%- endfor -%}"
        "{%- else -%}{%- for t in range(off, 60 - total + 1, per) -%}"
        "{%- set ns.jobs = ns.jobs + [{'min': t, 'hour': '*', 'day': '*'}] -%}{%- endfor -%}"
        "{%- endif -%}{{ ns.jobs | to_json }}")}}


def chooses(chosen: str, name: str, given: dict[str, Any]) -> bool:
    """Whether a task's ``service: "{{ x_services[...] }}"`` is this container's entry: by its
    name (``['nova-api']``, ``.memcached``) or by a variable the task sets to it
    (``[service_name]`` with ``service_name: mariadb``)."""
    keys = [k for k, v in given.items() if v == name]
    return (f"['{name}']" in chosen or f'["{name}"]' in chosen
            or re.search(r"\." + re.escape(name) + r"\s*\}\}", chosen) is not None
            or any(re.search(r"\[\s*" + re.escape(k) + r"\s*\]", chosen) for k in keys))


ITEM = re.compile(r"\{\{\s*item(?:\.(\w+))?\s*\}\}")


def per_item(tasks: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """A template task looping ``with_items`` over a list written out (``["memcached"]``,
    keystone-fernet's ``{src: crontab.j2, dest: crontab}`` entries): one task per item, with
    ``{{ item }}`` / ``{{ item.KEY }}`` put in its arguments and variables."""
    out: list[tuple[str, dict[str, Any]]] = []
    for file, task in tasks:
        items = task.get("with_items")
        module = next((k for k in TEMPLATE_MODULES if k in task), None)
        if module is None or not isinstance(items, list) or not items or not all(map(_literal, items)):
            out.append((file, task))
            continue
        for item in items:
            one = {k: v for k, v in task.items() if k != "with_items"}
            one[module] = _put_item(task[module], item)
            if isinstance(task.get("vars"), dict):
                one["vars"] = _put_item(task["vars"], item)
            out.append((file, one))
    return out


def _literal(item: Any) -> bool:
    if isinstance(item, dict):
        return all(isinstance(v, str) and not templated(v) for v in item.values())
    return isinstance(item, str) and not templated(item)


def _put_item(value: Any, item: Any) -> Any:
    if isinstance(value, dict):
        return {k: _put_item(v, item) for k, v in value.items()}
    if isinstance(value, list):
        return [_put_item(v, item) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return str(item) if isinstance(item, str) else m.group(0)
        return str(item[m.group(1)]) if isinstance(item, dict) and m.group(1) in item else m.group(0)

    return ITEM.sub(one, value)


SET_FACT = ("set_fact", "ansible.builtin.set_fact")


def set_facts(tasks: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """What a config task sets unconditionally to a value written out (horizon's
    ``custom_policy: []``, which later tasks extend from config/'s policy files, noted apart)."""
    out: dict[str, Any] = {}
    for _, task in tasks:
        module = next((k for k in SET_FACT if k in task), None)
        facts = task.get(module) if module else None
        if not isinstance(facts, dict) or "when" in task or any(k.startswith("with_") or k == "loop" for k in task):
            continue
        out.update({k: v for k, v in facts.items() if _written_out(v)})
    return out


def _written_out(value: Any) -> bool:
    if isinstance(value, dict):
        return all(map(_written_out, value.values()))
    if isinstance(value, list):
        return all(map(_written_out, value))
    return not templated(value)
