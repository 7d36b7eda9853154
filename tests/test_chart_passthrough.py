"""The chart's passthrough value on a real node: the host's sysfs, /dev/vfio and /proc reach the plugin under /host,
where ``--passthrough-host-root`` reads them (docs/passthrough.md)."""

from __future__ import annotations

from typing import Any

from support.helm import template


def plugin_mounts(*values: str) -> dict[str, dict[str, Any]]:
    objects = template(*[a for v in values for a in ("--set", v)])
    [daemonset] = [o for o in objects if o["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    [container] = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {
        m["mountPath"]: {**m, "hostPath": volumes[m["name"]].get("hostPath", {}).get("path")}
        for m in container["volumeMounts"]
    }


def test_the_hosts_proc_is_mounted_read_only_for_the_open_handle_check() -> None:
    mounts = plugin_mounts("passthrough.enabled=true")
    assert mounts["/host/proc"]["hostPath"] == "/proc" and mounts["/host/proc"]["readOnly"] is True
    assert mounts["/host/sys"]["hostPath"] == "/sys"
    assert "/host/proc" not in plugin_mounts()
