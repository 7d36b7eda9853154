"""GPU layer: the NVML port (``interface``, ``models``, ``errors``), its NVML adapter (``nvml``), the product facts
(``products``), discovery into our device model (``inventory``) and the backend factory (``backend``), the one door
to the simulated node in :mod:`dradriver.sim`."""
