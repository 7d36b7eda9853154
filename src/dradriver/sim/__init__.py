"""The simulated GPU node: everything that stands in for hardware and its host software, and nothing else.

- :mod:`~dradriver.sim.node`: the simulated node (GPUs, MIG, compute modes, NVLink, fabric, XIDs, ECC), persisted in
  a state file as hardware state outlives the driver.
- :mod:`~dradriver.sim.fakelib`: a fake ``libnvidia-ml.so`` behind the real ``pynvml``, so the production NVML adapter
  runs unchanged on the simulated node.
- :mod:`~dradriver.sim.profiles`: node profiles (``data/nodes``), built on the product facts of
  :mod:`dradriver.gpu.products`.
- :mod:`~dradriver.sim.driver_root`: a stub driver root (libraries, binaries, firmware) for CDI specs.
- :mod:`~dradriver.sim.mps_standin`: a stand-in for ``nvidia-cuda-mps-control``.

Production code reaches it only through :mod:`dradriver.gpu.backend` (and the CLI's ``sim`` and ``demo``
commands); the import contracts in pyproject.toml check that.
"""
