"""End to end on kind: slices are published, and a pod's GPU claim is allocated, prepared and injected."""

from __future__ import annotations

import json

from kindutil import run

POD = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: default}
spec:
  spec:
    devices:
      requests:
        - name: gpu
          exactly: {deviceClassName: gpu.dradriver.dev}
---
apiVersion: v1
kind: Pod
metadata: {name: gpu-pod, namespace: default}
spec:
  restartPolicy: Never
  resourceClaims:
    - {name: gpu, resourceClaimTemplateName: one-gpu}
  containers:
    - name: main
      image: busybox:1.36
      command: ["sh", "-c", "env | grep -E '^(NVIDIA_VISIBLE_DEVICES|DRADRIVER_DEVICE_)'; nvidia-smi; ls /dev/nvidia*"]
      resources:
        claims: [{name: gpu}]
"""


def test_the_driver_publishes_eight_gpus_for_the_node(cluster: str) -> None:
    out = run("kubectl", "--context", cluster, "get", "resourceslices", "-o", "json")
    devices = [
        d
        for s in json.loads(out)["items"]
        if s["spec"]["driver"] == "gpu.dradriver.dev"
        for d in s["spec"].get("devices", [])
    ]
    assert len(devices) == 8


def test_a_pod_gets_a_prepared_gpu_injected_through_cdi(cluster: str) -> None:
    run("kubectl", "--context", cluster, "apply", "-f", "-", input=POD)
    run(
        "kubectl",
        "--context",
        cluster,
        "wait",
        "pod/gpu-pod",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=180s",
    )
    logs = run("kubectl", "--context", cluster, "logs", "gpu-pod")
    assert "NVIDIA_VISIBLE_DEVICES=void" in logs
    assert "DRADRIVER_DEVICE_GPU_" in logs and "=GPU-" in logs
    assert "simulated NVIDIA driver" in logs  # the stub driver root's nvidia-smi, mounted by the CDI spec
    assert "/dev/nvidiactl" in logs
