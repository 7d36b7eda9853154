"""Watching the node while it serves: GPU health from NVML events and polls (``health``), Prometheus metrics
(``metrics``), which pod holds which device (``allocations``) and what each GPU is doing (``usage``).

May import: :mod:`dradriver.driver.prepare` (the checkpoint, sharing labels), ``plugin``, ``gpu`` and the leaves;
never ``publish``.
"""
