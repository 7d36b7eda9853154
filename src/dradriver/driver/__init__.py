"""Our DRA driver for NVIDIA GPUs (``gpu.dradriver.dev``), on the generic plugin layer; grouped by concern:

- :mod:`~dradriver.driver.prepare`: the prepare recipe. ``GpuDriver`` (``state``) runs a recorded transaction of
  steps (MIG, compute mode, time-slicing, MPS, the CDI spec), kept in the checkpoint, reconciled at start and
  re-checked while running; the opaque config API and the ``--compat`` presets.
- :mod:`~dradriver.driver.publish`: what the node offers, as ResourceSlices, and which devices are taken.
- :mod:`~dradriver.driver.observe`: health (XID, ECC, lost GPUs), metrics, allocations and usage.
- :mod:`~dradriver.driver.checks`: the node's preflight checks (NVML, the driver's files, device nodes, the
  runtime's CDI setting, the API server), each returning a typed result; ``dradriver doctor`` renders them.

The files of NVIDIA's own driver on the host (libraries, binaries, device nodes, the CDI edits that give them to a
container) are :mod:`dradriver.nvidia_install`'s, a package apart so that "driver" here means only ours.

May import: ``nvidia_install``, ``plugin``, ``gpu``, ``allocator``, ``cel`` and the leaves; never ``cli``,
``computedomain`` or ``sim``. Inside: ``observe`` and ``publish`` read ``prepare``'s checkpoint; ``prepare``
imports neither; none of them imports ``checks`` (contracts ``layers`` and ``driver-concerns`` in pyproject.toml).
"""
