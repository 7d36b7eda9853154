"""Generic kubelet-plugin layer; knows nothing about GPUs, a driver plugs in behind the handler interface.

Laid out as upstream's Go helpers:

- :mod:`~dradriver.plugin.handler`: the seam a driver implements (``DriverHandler``) and the types crossing it.
- :mod:`~dradriver.plugin.kubeletplugin`: registration, DRA and health gRPC services on unix sockets.
- :mod:`~dradriver.plugin.resourceslice`: the ResourceSlice publisher.
- :mod:`~dradriver.plugin.cluster`: the cluster port and its adapters (``kubernetes`` client, in-memory).
"""
