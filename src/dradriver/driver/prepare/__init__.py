"""The prepare recipe: everything between the kubelet's NodePrepareResources and a CDI spec, and back.

- ``state``: ``GpuDriver``, the recipe itself (plan, record, run the steps, answer the kubelet).
- ``transaction`` and ``steps``: a step is expect / run / undo, its intent checkpointed before it touches the
  hardware; ``steps`` lists them in order.
- the steps: ``mig`` (MIG mode, GPU and compute instances), ``sharing`` (compute mode, time-slicing, MPS, run by
  ``mps`` with its ``/dev/shm`` from ``mps_shm``), ``cdi_step`` (the claim's CDI spec, with ``device_status`` for
  the claim's status).
- ``checkpoint``: the one record of what is prepared; ``reconcile`` replays it at start, ``recheck`` while running.
- ``config``: the opaque config API (ours and NVIDIA's); ``presets``: the ``--compat`` names.

May import: :mod:`dradriver.nvidia_install`, ``plugin``, ``gpu`` and the leaves; never ``publish`` or ``observe``.
"""
