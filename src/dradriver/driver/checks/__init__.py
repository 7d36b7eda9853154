"""The node's preflight checks, each a small read-only function that returns a :class:`~.result.CheckResult`
(OK, WARN, FAIL with its fix, or SKIP), so ``dradriver doctor``, a readiness probe or a ``helm test`` can run them:

- ``result``: the result and its statuses.
- ``settings``: the typed inputs (paths, driver root, NVML library, kubeconfig) the checks read.
- ``host``: NVML, the GPUs, device nodes, persistence mode, the NVLink fabric, writable directories.
- ``driver_files``: NVIDIA's install under the driver root (libcuda, library classes, binaries, firmware) and
  the CDI hook.
- ``runtime``: the container runtime's CDI setting (containerd and CRI-O config files).
- ``cluster``: the API server's version, DRA API and DRA feature gates, read through an injected ``GET``.
- ``device_plugin``: NVIDIA's device plugin on the node (its kubelet socket, the Node's ``nvidia.com/`` resources),
  which ``run`` also asks before it publishes.

May import: :mod:`dradriver.driver.prepare`, ``publish``, ``observe``, ``nvidia_install``, ``gpu``, ``plugin``
(the cluster port) and the leaves; never ``cli`` or ``sim``. Nothing else in :mod:`dradriver.driver` imports it
(contract ``driver-concerns`` in pyproject.toml).
"""
