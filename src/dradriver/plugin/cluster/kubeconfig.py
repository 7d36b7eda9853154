"""Where a command finds its Kubernetes client configuration: one rule for every command, checked before use.

The first of these that is there (controller-runtime's ``GetConfig`` order, over client-go's loading rules):

1. ``--kubeconfig FILE`` (``DRADRIVER_KUBECONFIG``);
2. ``$KUBECONFIG``: one file or several separated by ``:``, merged as kubectl merges them (the first file to
   define a context, cluster or user, or to set ``current-context``, wins; a listed file that does not exist is
   skipped, but one must exist);
3. in a pod (``KUBERNETES_SERVICE_HOST`` set): its service account, unless ``--context`` names a context (the
   service account has none);
4. ``~/.kube/config``.

Kubeconfig files are read through the bounded loader (:mod:`dradriver.inputs`) and checked before the
``kubernetes`` client reads them: each is one YAML mapping, and the context used (``--context``, else
``current-context``) is defined, names a cluster that is defined with a server (and a ``proxy-url``, if any, that
is a string). A user it names that is not defined means no credentials, as in client-go (the API server then
sees an anonymous client). Every problem is one :class:`~dradriver.errors.ConfigError` line: the source, the
file, what is wrong and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dradriver.errors import ConfigError
from dradriver.inputs import load_yaml_file, path_exists, type_name

FLAG = "--kubeconfig"
#: The rule in a line, for the help of every flag that names a kubeconfig.
RULE = "default: $KUBECONFIG, else in a pod its service account, else ~/.kube/config"
_SECTIONS = ("contexts", "clusters", "users")
_USE_CONTEXT = "choose one with `kubectl config use-context NAME` (`kubectl config get-contexts` lists them)"
_FIX_CONTEXT = "fix the context: kubectl config set-context NAME --cluster CLUSTER --user USER"


@dataclass(frozen=True)
class ClientSource:
    """Where the client configuration comes from: ``origin`` names it in messages (``--kubeconfig``,
    ``$KUBECONFIG``, ``~/.kube/config``); ``files`` are the kubeconfig files, merged in this order (none for the
    in-cluster service account)."""

    origin: str
    files: tuple[Path, ...] = ()

    @property
    def in_cluster(self) -> bool:
        return not self.files

    def __str__(self) -> str:
        if self.in_cluster:
            return self.origin
        return f"{self.origin} {os.pathsep.join(str(f) for f in self.files)}"

    @property
    def fix(self) -> str:
        """What to do about a file of this source that the client cannot use."""
        if self.origin == FLAG:
            return "point --kubeconfig at a readable kubeconfig file"
        if self.origin == "$KUBECONFIG":
            return "point KUBECONFIG at a readable kubeconfig file, or unset it"
        return "fix it, or pass --kubeconfig FILE"


IN_CLUSTER = ClientSource("the in-cluster service account")


@dataclass(frozen=True)
class ChosenContext:
    """The kubeconfig context the client is to use, checked: its ``name``, and its cluster's ``proxy-url`` (None
    where it sets none; client-go then takes the proxy from the environment)."""

    name: str
    proxy_url: str | None = None


def in_a_pod() -> bool:
    """Whether this process runs in a pod: the kubelet sets ``KUBERNETES_SERVICE_HOST`` in every container."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def home_kubeconfig() -> Path | None:
    """``~/.kube/config`` (None when this user has no home directory)."""
    try:
        return Path.home() / ".kube" / "config"
    except RuntimeError:
        return None


def find_source(kubeconfig: str | None, *, context: str | None = None) -> ClientSource | None:
    """The first source of the rule that is there (``kubeconfig``: the value of ``--kubeconfig``); None when
    there is none. Given a ``context`` (``--context``), a pod's service account is passed over: it has no
    contexts, and kubectl in a pod looks for one in its kubeconfig files too (client-go's deferred loading takes
    the in-cluster configuration only when those say nothing)."""
    if kubeconfig:
        return ClientSource(FLAG, (Path(kubeconfig),))
    listed = [Path(p).expanduser() for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return ClientSource("$KUBECONFIG", tuple(listed))
    if in_a_pod() and not context:
        return IN_CLUSTER
    home = home_kubeconfig()
    return ClientSource("~/.kube/config", (home,)) if home is not None and path_exists(home) else None


def require_source(kubeconfig: str | None, *, context: str | None = None) -> ClientSource:
    """:func:`find_source`, or a ConfigError saying what was looked for and how to give one."""
    source = find_source(kubeconfig, context=context)
    if source is None:
        home = home_kubeconfig() or "~/.kube/config"
        if context and in_a_pod():
            raise ConfigError(
                f"no Kubernetes client configuration for --context {context}: no --kubeconfig, no $KUBECONFIG and "
                f"no {home}, and the pod's service account has no contexts; pass --kubeconfig FILE or set "
                "KUBECONFIG, or leave out --context to use the service account"
            )
        raise ConfigError(
            f"no Kubernetes client configuration: no --kubeconfig, no $KUBECONFIG, not in a pod "
            f"(KUBERNETES_SERVICE_HOST unset) and no {home}; pass --kubeconfig FILE or set KUBECONFIG"
        )
    return source


def checked_context(source: ClientSource, context: str | None = None) -> ChosenContext | None:
    """Read and check the kubeconfig files of ``source`` (see the module); the context the client is to use:
    ``context`` if given, else the ``current-context`` of the first file that sets one. None for the in-cluster
    service account."""
    if source.in_cluster:
        return None
    merged = _Merged(source)
    for file in _existing_files(source):
        merged.add(file, _one_mapping(source, file))
    return merged.context(context)


def unusable(source: ClientSource, problem: str, *, file: Path | None = None, fix: str | None = None) -> ConfigError:
    """The one-line error for a kubeconfig of ``source`` the client cannot use: the source (or ``file`` of it),
    ``problem`` and ``fix`` (by default the source's)."""
    where = f"{source.origin} {file}" if file is not None else str(source)
    return ConfigError(f"{where}: {problem}; {fix or source.fix}")


def _existing_files(source: ClientSource) -> list[Path]:
    """The files to read: ``--kubeconfig``'s must exist; of ``$KUBECONFIG``'s those that exist (as kubectl)."""
    if source.origin != "$KUBECONFIG":
        return list(source.files)
    existing = [f for f in source.files if path_exists(f)]
    if not existing:
        raise unusable(source, "none of the files it lists exists")
    return existing


def _one_mapping(source: ClientSource, file: Path) -> dict[str, Any]:
    """The one YAML mapping of kubeconfig ``file``, read within the bounded loader's limits."""
    try:
        # A key twice: the last value kept, as client-go's lenient YAML reading (sigs.k8s.io/yaml) keeps it.
        documents = load_yaml_file(file, duplicate_keys="last")
    except ConfigError as err:
        # The loader's message starts with the file and may carry its own fix ("save it as UTF-8").
        text = str(err)
        raise ConfigError(f"{source.origin} {text}" + ("" if ";" in text else f"; {source.fix}")) from None
    if len(documents) != 1 or not isinstance(documents[0], dict):
        if not documents:
            got = "an empty file"
        elif len(documents) > 1:
            got = f"{len(documents)} documents"
        else:
            got = type_name(documents[0])
        raise unusable(source, f"expected one kubeconfig mapping (kind: Config), got {got}", file=file)
    return documents[0]


@dataclass
class _Merged:
    """Kubeconfig files merged as client-go merges them: the first file to set a name or ``current-context``
    wins. ``named`` maps each section to its entries by name, with the file each came from."""

    source: ClientSource
    current: tuple[str, Path] | None = None
    named: dict[str, dict[str, tuple[Path, dict[str, Any]]]] = field(
        default_factory=lambda: {section: {} for section in _SECTIONS}
    )

    def add(self, file: Path, config: dict[str, Any]) -> None:
        current = config.get("current-context")
        if current is not None and not isinstance(current, str):
            raise unusable(self.source, f"current-context is {type_name(current)}, not a context's name", file=file)
        if current and self.current is None:
            self.current = (current, file)
        for section in _SECTIONS:
            entries = config.get(section) or []
            if not isinstance(entries, list):
                raise unusable(self.source, f"{section} is {type_name(entries)}, not a list", file=file)
            for position, entry in enumerate(entries):
                name = entry.get("name") if isinstance(entry, dict) else None
                if not isinstance(name, str) or not name:
                    raise unusable(self.source, f"{section}[{position}] has no name", file=file)
                self.named[section].setdefault(name, (file, entry))

    def context(self, given: str | None) -> ChosenContext:
        """The context to use, checked: defined, its cluster defined with a server. Its user need not be defined:
        client-go goes on without credentials (it requires a user only when ``--user`` names one)."""
        name = given or (self.current[0] if self.current else "")
        if not name:
            raise unusable(self.source, "no current-context is set", fix=_USE_CONTEXT)
        if name not in self.named["contexts"]:
            chosen = f"--context {name}" if given else f"current-context {name!r}"
            defined = self._names("contexts")
            raise unusable(
                self.source,
                f"{chosen} is not one of its contexts ({defined})",
                fix="pass one of them to --context" if given else _USE_CONTEXT,
            )
        file, entry = self.named["contexts"][name]
        body = entry.get("context")
        if not isinstance(body, dict):
            raise unusable(self.source, f"context {name!r} has no context: mapping", file=file, fix=_FIX_CONTEXT)
        return ChosenContext(name, self._check_cluster(name, body.get("cluster"), file))

    def _check_cluster(self, context: str, cluster: object, file: Path) -> str | None:
        """Check the cluster ``context`` names; its ``proxy-url``, if it sets one."""
        if not isinstance(cluster, str) or not cluster:
            raise unusable(self.source, f"context {context!r} names no cluster", file=file, fix=_FIX_CONTEXT)
        if cluster not in self.named["clusters"]:
            defined = self._names("clusters")
            problem = f"context {context!r} names cluster {cluster!r}, which is not defined ({defined})"
            raise unusable(self.source, problem, fix=_FIX_CONTEXT)
        defined_in, entry = self.named["clusters"][cluster]
        body = entry.get("cluster")
        server = body.get("server") if isinstance(body, dict) else None
        if not isinstance(server, str) or not server:
            raise unusable(
                self.source,
                f"cluster {cluster!r} has no server",
                file=defined_in,
                fix=f"set it: kubectl config set-cluster {cluster} --server https://HOST:PORT",
            )
        proxy_url = body.get("proxy-url") if isinstance(body, dict) else None
        if proxy_url is not None and not isinstance(proxy_url, str):
            raise unusable(
                self.source,
                f"cluster {cluster!r} has a proxy-url that is {type_name(proxy_url)}, not a URL",
                file=defined_in,
                fix=f"set it: kubectl config set-cluster {cluster} --proxy-url http://HOST:PORT",
            )
        return proxy_url or None

    def _names(self, section: str) -> str:
        names = sorted(self.named[section])
        return f"{section}: {', '.join(names)}" if names else f"it defines no {section}"
