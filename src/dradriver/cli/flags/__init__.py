"""The flags of the commands, in groups by concern, as kubernetes-sigs/dra-example-driver's ``pkg/flags``.

Each group is one module: it declares its flags once (:class:`~dradriver.cli.flags.env.EnvFlag`, each also read
from an environment variable), adds them to a command's parser (``add_flags``) and reads the parsed values into a
typed, frozen options dataclass (``from_args``) whose ``check`` refuses what cannot work. A flag means the same
everywhere: a command that takes it adds it from its group, wording its help for what that command does with it.

``env`` holds the mechanism, ``values`` the value types and path checks the groups share.
"""
