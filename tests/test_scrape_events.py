"""What leaves the node for other tools: the /metrics page as Prometheus scrapes it (both of
prometheus-client's parsers, the OpenMetrics one asked for by the Accept header, as Prometheus
asks), and notifications as an apprise target receives them (their type).

History used here::

    C1 initial deployment --- C2 identity: four API workers --- C3 identity: a config the program rejects
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Deployment, free_port, git
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as text_families
from test_notify import StartReceiver, break_identity, receiver  # noqa: F401  (the fixture, shared)

from reconciler.agent import Agent
from reconciler.daemon.afterpass import Outputs
from reconciler.daemon.notify import Event, Notifier
from reconciler.settings import MetricsConfig, NotifyConfig

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int, accept: str | None) -> tuple[str, str]:
    """The page and its content type, as a scraper asking for ``accept`` gets them."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.read().decode(), resp.headers.get("Content-Type", "")


def samples(families: object) -> Samples:
    out: Samples = {}
    for family in families:  # type: ignore[attr-defined]
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"sample {key} exported twice"
            out[key] = s.value
    return out


def labelled(m: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in m.items() if n == name}


def test_the_page_parses_as_text_and_as_openmetrics_with_one_series_per_commit_info(
    deployment: Deployment, agents: Callable[..., Agent], receiver: StartReceiver,  # noqa: F811
) -> None:
    hook = receiver(fail=0)
    port = free_port()
    ctl1 = agents("ctl1", deployment.url, metrics=MetricsConfig(listen=f"127.0.0.1:{port}"),
                  notify=NotifyConfig(apprise=(hook.url.replace("http://", "json://"),)))
    outputs = Outputs(ctl1)
    outputs.serve()
    pages: list[dict[str, Samples]] = []
    try:
        c1 = git("rev-parse", "HEAD", cwd=deployment.work)
        for step in range(3):
            if step == 1:
                deployment.edit("services/identity/templates/identity.conf.j2",
                                "port = {{ port_base + ports.identity }}",
                                "port = {{ port_base + ports.identity }}\nworkers = 4")
                c2 = deployment.commit("identity: four API workers")
            if step == 2:
                c3 = break_identity(deployment)
            outputs(ctl1.reconcile_once())
            text, text_type = scrape(port, None)
            om, om_type = scrape(port, OPENMETRICS)
            assert text_type.startswith("text/plain") and om_type.startswith("application/openmetrics-text")
            assert om.rstrip().endswith("# EOF")
            pages.append({"text": samples(text_families(text)),
                          "openmetrics": samples(openmetrics_families(om))})  # type: ignore[no-untyped-call]
    finally:
        outputs.close()

    for fmt in ("text", "openmetrics"):
        after_c1, after_c2, after_c3 = (p[fmt] for p in pages)
        # One series for the commit a node runs: the one before it is gone from the page, not left at 1.
        assert labelled(after_c1, "reconciler_applied_commit_info") == {(("commit", c1),): 1.0}
        assert labelled(after_c2, "reconciler_applied_commit_info") == {(("commit", c2),): 1.0}
        assert labelled(after_c3, "reconciler_applied_commit_info") == {(("commit", c2),): 1.0}
        assert labelled(after_c3, "reconciler_head_commit_info") == {(("commit", c3),): 1.0}
        # Each result once, the last poll's at 1.
        results = labelled(after_c3, "reconciler_last_poll_result")
        assert sorted(dict(k)["result"] for k in results) == sorted({dict(k)["result"] for k in results})
        assert {dict(k)["result"]: v for k, v in results.items() if v} == {"failed": 1.0}
    assert pages[2]["text"] == pages[2]["openmetrics"]

    # The notifications of the same passes: applied twice (success), then failed (failure).
    sent = [json.loads(body) for _, body in hook.accepted]
    assert [(m["title"].split()[2], m["type"]) for m in sent] == [
        ("applied", "success"), ("applied", "success"), ("failed", "failure")]


@pytest.mark.parametrize("event, apprise_type", [
    ("failed", "failure"), ("halted", "failure"), ("refused", "warning"),
    ("drift", "warning"), ("applied", "success"),
])
def test_each_event_goes_out_with_the_apprise_type_it_deserves(
    receiver: StartReceiver, tmp_path: Path, event: str, apprise_type: str,  # noqa: F811
) -> None:
    hook = receiver(fail=0)
    notifier = Notifier(NotifyConfig(apprise=(hook.url.replace("http://", "json://"),)), tmp_path)
    notifier.deliver(Event(event, "ctl1", "c" * 40, "WHY", "what happened", "2030-01-01T00:00:00Z"))
    assert [json.loads(body)["type"] for _, body in hook.accepted] == [apprise_type]
