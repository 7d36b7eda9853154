"""ComputeDomains: the second DRA driver, for multi-node NVLink (IMEX domains on GB200/GB300 NVL72 racks).

A ComputeDomain gives a job spread over several nodes of one NVLink clique an IMEX domain of its own. Four parts:

- :mod:`~dradriver.computedomain.api`: the CRDs' names and models, the opaque configs, the object names.
- :mod:`~dradriver.computedomain.controller`: the cluster controller (workload claim template, per-domain
  DaemonSet of IMEX daemons, clique indices, status, finalizers), leader-elected on a Lease.
- :mod:`~dradriver.computedomain.node`: the node side, a DRA driver on the generic plugin layer (channel and
  daemon devices).
- :mod:`~dradriver.computedomain.daemon`: the IMEX daemon supervisor run in the DaemonSet's pods.

It uses the plugin layer and the GPU layer (for fabric info); it never imports the GPU driver (``driver/``).
"""
