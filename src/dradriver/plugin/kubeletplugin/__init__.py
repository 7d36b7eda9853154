"""The kubelet side of the plugin layer (as upstream's Go ``kubeletplugin`` helper).

- :mod:`~dradriver.plugin.kubeletplugin.plugin`: ``KubeletPlugin``, the sockets, their watcher and the stop.
- :mod:`~dradriver.plugin.kubeletplugin.registration`: the kubelet's plugin-registration service.
- :mod:`~dradriver.plugin.kubeletplugin.dra_service`: the DRA v1/v1beta1 gRPC services over the driver's handler.
- :mod:`~dradriver.plugin.kubeletplugin.claims`: claim fetching and checking, per-claim serialisation.
- :mod:`~dradriver.plugin.kubeletplugin.device_metadata`: KEP-5304 device metadata files.
- :mod:`~dradriver.plugin.kubeletplugin.health`: the DRA health stream.
- :mod:`~dradriver.plugin.kubeletplugin.lifecycle`: instance locks, stop budgets, back-off.
- :mod:`~dradriver.plugin.kubeletplugin.kubelet_client`: a kubelet's view of a plugin (the demo, tests).
"""
