"""Certificates and keys of a lab cluster: a CA, the API server's serving certificate,
an admin client identity in ``system:masters``, the service-account signing key, and a
client identity per real node (``system:node:<name>`` in ``system:nodes``, what the node
authorizer and NodeRestriction expect of a kubelet).

Generated once per lab directory; the kubeconfigs embed them.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
"""The Services' virtual addresses (kube-apiserver's ``--service-cluster-ip-range``)."""

KUBERNETES_SERVICE_IP = "10.96.0.1"
"""The ``kubernetes`` Service's ClusterIP (the range's first address): in the API server's serving
certificate, and where a real node's pods reach the API server (devheal.lab.realnode)."""

_VALID = datetime.timedelta(days=365)


@dataclass(frozen=True)
class LabPki:
    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.directory / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.directory / "admin.key"

    @property
    def sa_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.directory / "sa.pub"

    def ensure(self) -> None:
        if all(p.exists() for p in (self.ca_cert, self.serving_cert, self.admin_cert, self.sa_key, self.sa_pub)):
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "devheal-lab-ca")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        _write_key(self.ca_key, ca_key)
        self.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))

        def leaf(
            common: str, orgs: list[str], usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]
        ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
            return _leaf(ca_key, ca_name, now, common, orgs, usage, sans)

        serving_sans: list[x509.GeneralName] = [
            x509.DNSName(name) for name in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
        ]
        serving_sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", KUBERNETES_SERVICE_IP)]
        key, cert = leaf("kube-apiserver", [], ExtendedKeyUsageOID.SERVER_AUTH, serving_sans)
        _write_key(self.serving_key, key)
        self.serving_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key, cert = leaf("devheal-lab-admin", ["system:masters"], ExtendedKeyUsageOID.CLIENT_AUTH, [])
        _write_key(self.admin_key, key)
        self.admin_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write_key(self.sa_key, sa)
        self.sa_pub.write_bytes(
            sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )

    def node_cert(self, node: str) -> Path:
        return self.directory / f"node-{node}.crt"

    def node_key(self, node: str) -> Path:
        return self.directory / f"node-{node}.key"

    def ensure_node(self, node: str) -> None:
        """The client identity of a real node's kubelet: CN ``system:node:<node>``, O ``system:nodes``."""
        if self.node_cert(node).exists() and self.node_key(node).exists():
            return
        self._sign_leaf(
            self.node_cert(node),
            self.node_key(node),
            f"system:node:{node}",
            ["system:nodes"],
            ExtendedKeyUsageOID.CLIENT_AUTH,
            [],
        )

    def loopback_cert(self, name: str) -> Path:
        return self.directory / f"{name}-serving.crt"

    def loopback_key(self, name: str) -> Path:
        return self.directory / f"{name}-serving.key"

    def ensure_loopback_serving(self, name: str) -> None:
        """A serving certificate for 127.0.0.1 and localhost, signed by the lab's CA: a webhook server on
        loopback (Kueue's) that the lab's API server calls with ``url: https://127.0.0.1:<port>/...``."""
        if self.loopback_cert(name).exists() and self.loopback_key(name).exists():
            return
        sans: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        self._sign_leaf(
            self.loopback_cert(name), self.loopback_key(name), name, [], ExtendedKeyUsageOID.SERVER_AUTH, sans
        )

    def _sign_leaf(
        self,
        cert_path: Path,
        key_path: Path,
        common: str,
        orgs: list[str],
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName],
    ) -> None:
        """A new key and certificate signed by the lab's CA (made first if need be), written to the two paths."""
        self.ensure()
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{self.ca_key} is not the EC key this lab's CA is made with; remove {self.directory}")
        ca_name = x509.load_pem_x509_certificate(self.ca_cert.read_bytes()).subject
        now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
        key, cert = _leaf(ca_key, ca_name, now, common, orgs, usage, sans)
        _write_key(key_path, key)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def kubeconfig(
        self, server: str, user: str = "devheal-lab-admin", cert: Path | None = None, key: Path | None = None
    ) -> str:
        """A kubeconfig for ``server``: the admin identity, or the client ``cert`` and ``key`` given."""

        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "devheal-lab",
                    "cluster": {"server": server, "certificate-authority-data": b64(self.ca_cert)},
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(cert or self.admin_cert),
                        "client-key-data": b64(key or self.admin_key),
                    },
                }
            ],
            "contexts": [{"name": "devheal-lab", "context": {"cluster": "devheal-lab", "user": user}}],
            "current-context": "devheal-lab",
        }
        return yaml.safe_dump(doc, sort_keys=False)


def _leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    now: datetime.datetime,
    common: str,
    orgs: list[str],
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName],
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in orgs]
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALID)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
