"""A real Kubernetes control plane on loopback for the `cluster` tests: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager (the resource-claim and service-account controllers only), from the binaries
``scripts/build-control-plane`` builds. Like controller-runtime's envtest, plus the real scheduler.

There is no kubelet: :func:`register_node` plays its part towards the API server (a Ready Node whose Lease it
renews) and the node lifecycle controller's one part we need (lifting the not-ready taint admission puts on a
new Node); :class:`KubeletStandIn` calls the plugin for pods the scheduler bound to the node.
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from support.kube_rest import ApiError, Credentials, Kube

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-control-plane"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
# The older API servers (1.33: resource.k8s.io v1beta2 and v1beta1; 1.32: v1beta1; no v1) and their build script.
OLDER_BUILD_SCRIPT = REPO / "scripts" / "build-older-apiservers"
START_TIMEOUT = 90.0
# Feature gates of the pinned release (1.37) our driver's slices and claims rely on, named even where that
# release has them on by default, so a pin moved back to a release where they are off still turns them on.
# GenericWorkload (beta in 1.37, off by default) serves Workload and PodGroup (scheduling.k8s.io/v1beta1, also named in
# RUNTIME_CONFIG), the pod's spec.schedulingGroup, and adds the scheduler's GangScheduling plugin: the gang recipe.
FEATURE_GATES = (
    "DRADeviceTaints=true,DRADeviceTaintRules=true,DRAPartitionableDevices=true,DRAConsumableCapacity=true,"
    "DRAListTypeAttributes=true,GenericWorkload=true"
)
# The claim and service-account controllers the cluster tests need; the node tests' workloads (the example
# scenarios' Deployments, namespaces) also need Deployments, ReplicaSets, namespace deletion and the garbage collector;
# the ComputeDomain tests the DaemonSet controller (per-domain daemon DaemonSets; the collector removes cliques). The
# chart installed on the real node (tests/node/test_helm_install.py) needs DaemonSets too, and the root-CA publisher
# (with --root-ca-file), without which a pod's service-account ca.crt is empty and the in-cluster client refuses it.
# The quota recipe (tests/cluster/test_recipe_quotas.py) needs the resource-quota controller: quota admission refuses
# every create in a namespace whose ResourceQuota has no status yet ("status unknown for quota").
# The gang recipe (tests/node/test_recipe_gangs.py) needs the PodGroup protection controller: with GenericWorkload
# admission puts the scheduling.k8s.io/podgroup-protection finalizer on every PodGroup, and only that controller
# lifts it (once no pod names the group), so a PodGroup could never be deleted without it.
# The chart's uninstall hook (a Job taking the node labels off; tests/node/test_helm_install.py) needs the Job
# controller: without it the Job never gets a pod and `helm uninstall` waits for it until its timeout.
CONTROLLERS = (
    "resourceclaim-controller,serviceaccount-controller,deployment-controller,replicaset-controller,"
    "namespace-controller,garbage-collector-controller,daemonset-controller,root-ca-certificate-publisher-controller,"
    "resourcequota-controller,podgroup-protection-controller,job-controller"
)
# v1alpha3 for DeviceTaintRule in its alpha form, as e2e/kind-config.yaml serves it (an example uses it);
# scheduling.k8s.io/v1beta1 for Workload and PodGroup (a beta API, off unless named; the gang recipe).
RUNTIME_CONFIG = "resource.k8s.io/v1=true,resource.k8s.io/v1alpha3=true,scheduling.k8s.io/v1beta1=true"


def binaries_dir() -> Path:
    """Where the build script puts (or would put) the binaries for the pinned release."""
    override = os.environ.get("DRADRIVER_CONTROL_PLANE_DIR")
    if override:
        return Path(override)
    out = subprocess.run(["bash", str(BUILD_SCRIPT), "--print"], capture_output=True, text=True, check=True, timeout=30)
    return Path(out.stdout.strip())


def missing_binaries(directory: Path) -> list[str]:
    return [name for name in BINARIES if not os.access(directory / name, os.X_OK)]


def older_apiserver(release: str) -> Path:
    """Where scripts/build-older-apiservers puts (or would put) the kube-apiserver of ``release`` ("1.33")."""
    out = subprocess.run(["bash", str(OLDER_BUILD_SCRIPT), "--print", release], capture_output=True, text=True,
                         check=True, timeout=30)  # fmt: skip
    return Path(out.stdout.strip()) / "kube-apiserver"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# --- PKI -------------------------------------------------------------------------------------------------------


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: Any) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def _cert(
    subject: x509.Name, key: Any, issuer: x509.Name, signer: Any, *, ca: bool = False, sans: list[Any] | None = None
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH, x509.ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(signer, hashes.SHA256())


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def write_pki(directory: Path) -> Pki:
    """A CA; the API server's serving certificate for loopback; an admin client certificate (system:masters);
    the service-account signing key pair."""
    import ipaddress

    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dradriver-test-ca")])
    ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)
    pki = Pki(*(directory / n for n in ("ca.crt", "apiserver.crt", "apiserver.key", "admin.crt", "admin.key")),
              sa_key=directory / "sa.key", sa_pub=directory / "sa.pub")  # fmt: skip
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_key(directory / "ca.key", ca_key)  # for client certificates issued later (a kubelet's)
    serving_key = _key()
    sans = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes.default.svc"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
    ]
    serving = _cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]), serving_key, ca_name,
                    ca_key, sans=sans)  # fmt: skip
    pki.serving_cert.write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.serving_key, serving_key)
    admin_key = _key()
    admin_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "admin"),
        ]
    )
    admin = _cert(admin_name, admin_key, ca_name, ca_key)
    pki.admin_cert.write_bytes(admin.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.admin_key, admin_key)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pki


def issue_client_certificate(pki: Pki, name: str, common_name: str, organization: str) -> tuple[Path, Path]:
    """A client certificate signed by the test CA, for another identity (e.g. a kubelet's
    ``system:node:<name>`` in ``system:nodes``): its certificate and key files beside the CA's."""
    directory = pki.ca_cert.parent
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
    key = _key()
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )
    cert, key_file = directory / f"{name}.crt", directory / f"{name}.key"
    cert.write_bytes(_cert(subject, key, ca.subject, ca_key).public_bytes(serialization.Encoding.PEM))
    _write_key(key_file, key)
    return cert, key_file


def write_kubeconfig(
    path: Path, server: str, ca: Path, cert: Path | None = None, key: Path | None = None, *, token: str = ""
) -> Path:
    """A kubeconfig with a client certificate, or with a bearer token."""
    user = f"token: {token}" if token else f"client-certificate: {cert}\n    client-key: {key}"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n"
        f"users:\n- name: admin\n  user:\n    {user}\n"
        "contexts:\n- name: test\n  context:\n    cluster: test\n    user: admin\n"
        "current-context: test\n"
    )
    return path


# --- processes -------------------------------------------------------------------------------------------------


@dataclass
class Component:
    """One control-plane process; its output goes to ``log`` (kept for failures)."""

    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] | None = None  # None: this process's environment

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=self.env
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)


def _healthy(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@dataclass
class ControlPlane:
    """Starts and stops the four components; ``kube`` is an admin client, ``kubeconfig`` an admin kubeconfig.

    ``apiserver`` (another release's kube-apiserver binary), ``runtime_config`` and ``feature_gates`` start an
    older API server over the same etcd (:meth:`start_api_server`: no scheduler or controllers);
    ``apiserver_args`` are more flags for it (an audit log)."""

    binaries: Path
    root: Path
    components: list[Component] = field(default_factory=list)
    apiserver: Path | None = None
    runtime_config: str = RUNTIME_CONFIG
    feature_gates: str = FEATURE_GATES
    apiserver_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pki = write_pki(self.root / "pki")
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = write_kubeconfig(
            self.root / "admin.kubeconfig", self.server, self.pki.ca_cert, self.pki.admin_cert, self.pki.admin_key
        )
        self.kube = Kube(Credentials(self.server, self.pki.ca_cert, self.pki.admin_cert, self.pki.admin_key))

    def _component(self, name: str, *args: str) -> Component:
        binary = self.apiserver if name == "kube-apiserver" and self.apiserver else self.binaries / name
        component = Component(name, [str(binary), *args], self.logs / f"{name}.log")
        component.start()
        self.components.append(component)
        return component

    def _wait(self, component: Component, ready: Callable[[], bool]) -> None:
        try:
            self.kube.wait(f"{component.name} to be ready", lambda: ready() or not component.alive(), START_TIMEOUT)
        except TimeoutError:
            raise RuntimeError(f"{component.name} did not become ready:\n{component.tail()}") from None
        if not component.alive():
            raise RuntimeError(f"{component.name} exited with {component.proc and component.proc.returncode}:\n"
                               f"{component.tail()}")  # fmt: skip

    def start_api_server(self) -> None:
        """etcd and kube-apiserver only."""
        client, peer = free_port(), free_port()
        etcd = self._component(
            "etcd",
            "--name=test",
            f"--data-dir={self.root / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=test=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync",  # a throw-away store: durability buys nothing and costs seconds
            "--log-level=warn",
        )
        self._wait(etcd, lambda: _healthy(f"http://127.0.0.1:{client}/health"))
        apiserver = self._component(
            "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={self.root / 'apiserver-certs'}",
            f"--tls-cert-file={self.pki.serving_cert}",
            f"--tls-private-key-file={self.pki.serving_key}",
            f"--client-ca-file={self.pki.ca_cert}",
            f"--service-account-key-file={self.pki.sa_pub}",
            f"--service-account-signing-key-file={self.pki.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--api-audiences=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=Node,RBAC",
            *([f"--feature-gates={self.feature_gates}"] if self.feature_gates else []),
            *([f"--runtime-config={self.runtime_config}"] if self.runtime_config else []),
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",  # as kubeadm and kind run it: the plugin DaemonSet is privileged
            "--v=1",
            *self.apiserver_args,
        )
        self._wait(apiserver, self.kube.healthy)

    def start(self) -> None:
        self.start_api_server()
        admin = str(self.kubeconfig)
        scheduler_port = free_port()
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # the components' own self-signed serving certificates
        scheduler = self._component(
            "kube-scheduler",
            f"--kubeconfig={admin}",
            f"--authentication-kubeconfig={admin}",
            f"--authorization-kubeconfig={admin}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={scheduler_port}",
            f"--cert-dir={self.root / 'scheduler-certs'}",
            f"--feature-gates={self.feature_gates}",
            "--v=2",
        )
        manager_port = free_port()
        manager = self._component(
            "kube-controller-manager",
            f"--kubeconfig={admin}",
            f"--authentication-kubeconfig={admin}",
            f"--authorization-kubeconfig={admin}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={manager_port}",
            f"--cert-dir={self.root / 'manager-certs'}",
            f"--controllers={CONTROLLERS}",
            f"--root-ca-file={self.pki.ca_cert}",
            f"--feature-gates={self.feature_gates}",
            "--v=2",
        )
        self._wait(scheduler, lambda: _healthy(f"https://127.0.0.1:{scheduler_port}/healthz", insecure))
        self._wait(manager, lambda: _healthy(f"https://127.0.0.1:{manager_port}/healthz", insecure))
        # Pods need their namespace's default ServiceAccount (admission looks it up): made by the controller.
        self.kube.wait("the default ServiceAccount", lambda: self.kube.find("serviceaccounts", "default", "default"))

    def dead_components(self) -> list[str]:
        return [c.name for c in self.components if not c.alive()]

    def stop(self) -> None:
        for component in reversed(self.components):
            component.stop()

    def discard(self) -> None:
        """Remove the state (etcd data, keys) but keep the logs."""
        for sub in ("etcd", "pki", "apiserver-certs", "scheduler-certs", "manager-certs"):
            shutil.rmtree(self.root / sub, ignore_errors=True)


# --- nodes -----------------------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeKeeper:
    """A Ready Node, as a kubelet keeps it: created with capacity, Ready, its Lease renewed every few seconds."""

    RENEW_SECONDS = 10.0

    def __init__(self, kube: Kube, name: str, labels: dict[str, str] | None = None) -> None:
        self.kube = kube
        self.name = name
        self._stop = threading.Event()
        self.node = kube.create(
            "nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            },
        )
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        condition = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet stand-in of the cluster tests",
            "lastHeartbeatTime": _now(),
            "lastTransitionTime": _now(),
        }
        kube.patch(
            "nodes", name, {"status": {"capacity": resources, "allocatable": resources, "conditions": [condition]}},
            sub="status",
        )  # fmt: skip
        # The TaintNodesByCondition admission plugin taints a new Node not-ready; the node lifecycle controller
        # lifts it once the node reports Ready. That controller is not running, so the keeper does it.
        kube.wait(
            f"node {name} to lose its not-ready taint",
            lambda: self._untaint() or not kube.get("nodes", name)["spec"].get("taints"),
        )
        self._renew()
        self._thread = threading.Thread(target=self._loop, name=f"lease-{name}", daemon=True)
        self._thread.start()

    def _untaint(self) -> bool:
        node = self.kube.get("nodes", self.name)
        taints = [t for t in node["spec"].get("taints") or [] if t["key"] != "node.kubernetes.io/not-ready"]
        self.kube.patch("nodes", self.name, {"spec": {"taints": taints or None}})
        return False

    def _renew(self) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": "kube-node-lease",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self.node["metadata"]["uid"]}
                ],
            },
            "spec": {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": _now()},
        }
        if self.kube.find("leases", self.name, "kube-node-lease") is None:
            self.kube.create("leases", body, "kube-node-lease")
        else:
            self.kube.patch("leases", self.name, {"spec": {"renewTime": _now()}}, "kube-node-lease")

    def _loop(self) -> None:
        while not self._stop.wait(self.RENEW_SECONDS):
            try:
                self._renew()
            except (ApiError, OSError, urllib3.exceptions.HTTPError):
                continue  # the API server is going away at the end of the session (urllib3 wraps a refused connection)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
