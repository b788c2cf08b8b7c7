"""A small value that shares its parts must not print as a huge string.

Sixty lists each holding the previous one twice take sixty lists of memory, but print as 2**60
items: Python's C-level ``str()``, ``repr()`` and ``json.dumps`` build that text with no check
the render's deadline could interrupt. Every way a template turns a value into text measures
its expanded size first, and refuses it with the located value limit.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest
from test_limits import make, render, validate

from reconciler.core.limits import Limits

DOUBLED = "{% set ns = namespace(a=['x']) %}{% for i in range(60) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}"
ERROR = ("services/api/templates/api.conf.j2:1: node n1, service api: a value larger than 10 MiB "
         "(render limit)")


@pytest.mark.parametrize("printed", [
    "{{ ns.a }}",
    "{{ ns.a | tojson }}",
    "{{ ns.a | string }}",
    "{{ 'p' ~ ns.a }}",
    "{{ ns.a | join }}",
    "{{ ns.a | pprint }}",
    "{{ '%s' % ns.a }}",
    "{{ '{}'.format(ns.a) }}",
    "{% set d = {'k': ns.a} %}{{ d }}",
    "{{ ns }}",
    "{{ ns.a | upper }}",
], ids=["output", "tojson", "string", "concat", "join", "pprint", "percent", "format", "dict", "namespace",
        "upper"])
def test_a_self_sharing_value_is_refused_before_it_is_printed(tmp_path: Path, printed: str) -> None:
    repo = make(tmp_path, {"services/api/templates/api.conf.j2": DOUBLED + printed})

    proc = validate(repo)

    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [ERROR]


@pytest.mark.parametrize("printed", ["{{ ns.a | to_json }}", "{{ ns.a | to_nice_json }}", "{{ ns.a | to_yaml }}",
                                     "{{ ns.a | to_nice_yaml }}", "{{ ns.a is match('x') }}",
                                     "{{ ns.a is version('1', '<') }}"])
def test_the_ansible_dialects_serializers_and_tests_measure_first_too(tmp_path: Path, printed: str) -> None:
    repo = make(tmp_path, {"reconciler.yaml": "format: 1\nname: small\ntemplates:\n  dialect: ansible\n",
                           "services/api/templates/api.conf.j2": DOUBLED + printed})

    proc = validate(repo)

    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [ERROR]


CONFIG = {f"section{i}": {"enabled": True, "port": 8000 + i, "hosts": [f"10.0.0.{j}" for j in range(5)],
                          "opts": {"name": f"svc-{i}", "ratio": 0.5, "none": None}} for i in range(20)}
ITEMS = [{"name": f"item{i}", "id": i, "tags": ["a", "b"]} for i in range(1000)]


@pytest.mark.parametrize("template", [
    "{{ config }}", "{{ config | tojson }}", "{{ items | tojson }}", "{{ items }}", "{{ 'p' ~ items }}",
    "{{ config | string }}", "{{ config | pprint }}", "{{ '%s' % (items,) }}", "{{ '{}'.format(config) }}",
    "{{ config.section1.hosts | join(',') }}", "{% set s = [config, config] %}{{ s }}",
])
def test_ordinary_nested_values_render_as_jinja_renders_them(tmp_path: Path, template: str) -> None:
    variables = "vars:\n  config: " + json.dumps(CONFIG) + "\n  items: " + json.dumps(ITEMS) + "\n"
    inventory = variables + "groups:\n  web:\n    services: [api]\nnodes:\n  n1:\n    groups: [web]\n"

    got = render(tmp_path, template, Limits(), **{"inventory.yaml": inventory})

    expected = jinja2.Environment(keep_trailing_newline=True).from_string(template).render(config=CONFIG, items=ITEMS)
    assert got == expected.encode()
