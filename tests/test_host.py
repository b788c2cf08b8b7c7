"""Host domains and the top of the ladder: files on the node itself, drain hooks, a reboot
that the next agent run picks up.

A real reboot of the test machine cannot run here: the reboot command in these tests writes
a new boot id to a file the agent reads instead of /proc/sys/kernel/random/boot_id.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from conftest import Deployment, SigningKey, small_deployment

from reconciler.agent import Agent
from reconciler.settings import HostConfig, TrustConfig

HOST = """\
driver: host
files:
  - {path: /etc/sysctl.d/90-cloud.conf, template: sysctl.conf.j2}
  - {path: /etc/default/grub.d/50-cloud.cfg, template: kernel.cfg.j2}
on_change:
  - {file: /etc/sysctl.d/*, action: reload, command: "cp $ROOT/etc/sysctl.d/90-cloud.conf $ROOT/applied-sysctl"}
drain: "echo drain >> $ROOT/hooks.log"
undrain: "echo undrain >> $ROOT/hooks.log"
"""


def host_repo(tmp_path: Path, key: SigningKey) -> Deployment:
    files = {
        "reconciler.yaml": "format: 1\nname: hosts\n",
        "inventory.yaml": ("vars: {swappiness: 60, hugepages: 0}\ngroups:\n  hv: {services: [host]}\n"
                           "nodes:\n  hv1: {groups: [hv]}\n"),
        # Hooks start from a clean environment: they name the test root, not $ROOT.
        "services/host/service.yaml": HOST.replace("$ROOT/hooks.log", f"{tmp_path / 'hostroot'}/hooks.log"),
        "services/host/templates/sysctl.conf.j2": "vm.swappiness = {{ swappiness }}\n",
        "services/host/templates/kernel.cfg.j2": "GRUB_CMDLINE_LINUX=\"hugepages={{ hugepages }}\"\n",
    }
    return small_deployment(tmp_path, key, files, "hosts")


def test_host_files_reload_by_command_and_reboot_then_resume(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent], monkeypatch: object
) -> None:
    import os

    root = tmp_path / "hostroot"
    root.mkdir()
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    os.environ["ROOT"] = str(root)  # the hooks and rule commands above write under the test root
    dep = host_repo(tmp_path, merge_key)
    host = HostConfig(root=root, reboot_command=f"echo boot-2 > {boot}", boot_id_file=boot)
    node = agents("hv1", dep.url, trust=TrustConfig(allowed_signers=merge_key.allowed_signers), host=host)

    first = node.reconcile_once()
    assert first.exit_code == 0
    assert (root / "etc/sysctl.d/90-cloud.conf").read_text() == "vm.swappiness = 60\n"
    assert (root / "applied-sysctl").read_text() == "vm.swappiness = 60\n"

    # sysctl only: the rule's command applies it, no reboot.
    dep.edit("inventory.yaml", "swappiness: 60", "swappiness: 10")
    dep.commit("less swapping")
    result = node.reconcile_once()
    [svc] = result.report.services  # type: ignore[union-attr]
    assert (str(svc.action), svc.reason) == ("reload", "only vm.swappiness changed in /etc/sysctl.d/90-cloud.conf")
    assert (root / "applied-sysctl").read_text() == "vm.swappiness = 10\n"

    # Kernel arguments: no rule explains them, so the host's default, a reboot, with drain first.
    dep.edit("inventory.yaml", "hugepages: 0", "hugepages: 512")
    c3 = dep.commit("hugepages")
    result = node.reconcile_once()
    assert result.exit_code == 0 and result.report is not None and result.report.state == "rebooting"
    [svc] = result.report.services
    assert str(svc.action) == "reboot"
    assert "(no rule: reboot)" in svc.reason
    assert (root / "etc/default/grub.d/50-cloud.cfg").read_text() == 'GRUB_CMDLINE_LINUX="hugepages=512"\n'
    assert (dep.note("hv1", c3) or {}).get("state") == "rebooting"
    assert (root / "hooks.log").read_text() == "drain\n"

    # The node comes back (new boot id): the agent finishes the commit and undrains.
    after = node.reconcile_once()
    assert after.exit_code == 0 and after.report is not None and after.report.state == "applied"
    assert any(e.startswith(f"rebooted for {c3[:12]} (boot id boot-1 -> boot-2)") for e in after.report.events)
    assert (root / "hooks.log").read_text() == "drain\nundrain\n"
    note = dep.note("hv1", c3) or {}
    assert note.get("state") == "applied" and note.get("events")
    del monkeypatch


def test_reboot_pending_holds_the_node(tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]) -> None:
    import os

    root = tmp_path / "hostroot"
    root.mkdir()
    os.environ["ROOT"] = str(root)
    boot = tmp_path / "boot_id"
    boot.write_text("same\n")
    dep = host_repo(tmp_path, merge_key)
    host = HostConfig(root=root, reboot_command="true", boot_id_file=boot)  # the reboot does not happen
    node = agents("hv1", dep.url, trust=TrustConfig(allowed_signers=merge_key.allowed_signers), host=host)
    node.reconcile_once()
    dep.edit("inventory.yaml", "hugepages: 0", "hugepages: 512")
    c2 = dep.commit("hugepages")
    assert node.reconcile_once().report.state == "rebooting"  # type: ignore[union-attr]
    waiting = node.reconcile_once()
    assert waiting.report is None and waiting.commit == c2 and waiting.exit_code == 0


def test_drain_restart_runs_the_hooks_around_the_restart(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    log = tmp_path / "hooks.log"
    deployment.edit("services/compute-agent/service.yaml", "  - {file: compute.json, keys: [hypervisor], action: restart}",
                    "  - {file: compute.json, keys: [hypervisor], action: drain+restart}")
    deployment.write("services/compute-agent/service.yaml", deployment.read("services/compute-agent/service.yaml")
                     + f"drain: \"echo drain $RECONCILER_SERVICE >> {log}\"\nundrain: \"echo undrain >> {log}\"\n")
    deployment.commit("computes drain before a hypervisor change")
    cmp1 = agents("cmp1", deployment.url)
    cmp1.reconcile_once()
    assert not log.exists()
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    deployment.commit("kvm")
    result = cmp1.reconcile_once()
    agent_result = next(r for r in result.report.services if r.service == "compute-agent")  # type: ignore[union-attr]
    assert str(agent_result.action) == "drain+restart" and agent_result.steps == ("drain+restart: ok",)
    assert log.read_text() == "drain compute-agent\nundrain\n"


def test_a_reboot_steps_hook_that_hangs_or_fails_is_a_reason_not_a_traceback() -> None:
    from reconciler.drivers.hostaccess import HostAccess
    from reconciler.drivers.steprun import host_command as _host_command

    host = HostAccess()
    assert _host_command(host, "true", 5) == ""
    assert _host_command(host, "echo no compute service to disable >&2; exit 3", 5) == \
        "no compute service to disable"
    assert _host_command(host, "exit 4", 5) == "exit 4"
    assert _host_command(host, "sleep 5", 0.2) == "timed out after 0.2s"
