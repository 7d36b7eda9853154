"""What the node offers: ResourceSlices built from the inventory (``slices``: whole GPUs, MIG devices on shared
counters, per Kubernetes version), which devices prepared claims hold (``slice_map``) and the Node labels GPU
Feature Discovery would write (``node_labels``), kept on the Node by ``node_labeler``.

May import: :mod:`dradriver.driver.prepare` (the checkpoint), ``gpu``, the cluster port (the Node's labels) and the
leaves; never ``observe``.
"""
