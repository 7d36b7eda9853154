"""GPU layer: the NVML port (``interface``, ``models``, ``errors``), its NVML adapter (``nvml``), the product facts
(``products``), discovery into our device model (``inventory``), the backend factory (``backend``), the one door
to the simulated node in :mod:`dradriver.sim`, and the port to Fabric Manager's NVSwitch partitions
(``fabric_manager``) with its client of FM's library on a real node (``nvfm``)."""
