"""NVIDIA's driver as installed on the host, and how a container gets it; not our DRA driver (:mod:`dradriver.driver`).

- ``driver_root``: finds the install (libraries, binaries, firmware, IPC sockets) under a root the way NVIDIA's
  container toolkit does: the root's linker cache (``ldcache``), ``ld.so.conf``, the usual directories, with
  symlinks followed inside the root (``root_paths``).
- ``device_nodes``: a GPU's ``/dev`` nodes (and its DRI nodes).
- ``cdi``: CDI specs built from them (container paths, hooks, env) and written atomically.
- ``cdi_hook``: NVIDIA's ``nvidia-cdi-hook`` shipped onto the host for the specs to call, and asked its version
  (which subcommands a spec may name).

May import: ``gpu`` (device models) and the leaves; never ``driver``, ``plugin``, ``cli`` or ``sim``.
"""
