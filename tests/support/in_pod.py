"""`dradriver run` configured as in a pod: the in-cluster service account (token and CA files, the
``KUBERNETES_SERVICE_*`` variables) against the API server stand-in over HTTPS, instead of a kubeconfig.

A kubeconfig brings the client's kubeconfig loader, and with it the client's ``ApiClient``, pydantic, oauthlib and
requests, which a deployed driver never loads: what `run` imports and how much memory it holds must be measured
this way (docs/reliability.md). The service account files live at fixed paths in a pod; the entry points the
service account reader (``plugin/cluster/transport.py``) at a directory of the test's instead (as ``test_kube.py``
does)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from support.apiserver import TOKEN, FakeApiServer
from support.control_plane import write_pki


@dataclass(frozen=True)
class Pod:
    """The stand-in, and what starts `dradriver` as in a pod: ``entry`` replaces ``-m dradriver``."""

    api: FakeApiServer
    env: dict[str, str]
    token: Path
    ca: Path

    def entry(self, before: str = "") -> tuple[str, str]:
        """``-c`` code running `dradriver` with the service account files here; ``before``: statements to run
        first (one line)."""
        code = (
            "from dradriver.plugin.cluster import transport; "
            f"transport.SERVICE_ACCOUNT_TOKEN = {str(self.token)!r}; "
            f"transport.SERVICE_ACCOUNT_CA = {str(self.ca)!r}; "
            f"{before + '; ' if before else ''}"
            "import runpy; runpy.run_module('dradriver', run_name='__main__', alter_sys=True)"
        )
        return "-c", code


@contextlib.contextmanager
def in_a_pod(directory: Path, *, validate: bool = True) -> Iterator[Pod]:
    """A started HTTPS stand-in and the service account of a pod that talks to it."""
    pki = write_pki(directory / "pki")
    token = directory / "token"
    token.write_text(TOKEN)
    with FakeApiServer(validate=validate, tls=(pki.serving_cert, pki.serving_key)) as api:
        port = api.url.rsplit(":", 1)[1]
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
        yield Pod(api, env, token, pki.ca_cert)
