"""A throwaway PKI for the local control plane, generated with ``cryptography``.

One CA signs everything: the API server's serving certificate, the client certificates of the
admin, the controller manager and the scheduler (the identities the RBAC bootstrap policy
already binds); a second CA backs the aggregation layer's request-header authentication, and a
separate key signs ServiceAccount tokens. ECDSA P-256 keeps generation
instant. Tests reuse :func:`make_ca` and :func:`issue` for their own TLS endpoints (a webhook
needs a serving certificate and a ``caBundle``).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM private key."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """Writes ``name.crt`` and ``name.key`` (mode 0600) and returns their paths."""
        directory.mkdir(parents=True, exist_ok=True)
        crt, key = directory / f"{name}.crt", directory / f"{name}.key"
        crt.write_bytes(self.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(self.key_pem)
        return crt, key


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> datetime.datetime:
    # Backdated a little so that a clock a few seconds behind still accepts the certificates.
    return datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)


def make_ca(common_name: str = "kn-rescheduler-local-ca") -> KeyPair:
    """A self-signed CA certificate."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(
    ca: KeyPair,
    common_name: str,
    *,
    organizations: tuple[str, ...] = (),
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
    server: bool = False,
    client: bool = False,
) -> KeyPair:
    """A certificate signed by ``ca``: a serving certificate (``server``), a client one, or both.

    For Kubernetes client certificates the common name is the user name and each organization a
    group (``system:masters`` makes a cluster admin).
    """
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError("the CA key must be an ECDSA key made by make_ca()")
    key = _new_key()
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def service_account_key() -> tuple[bytes, bytes]:
    """The (private PEM, public PEM) pair that signs and verifies ServiceAccount tokens."""
    key = _new_key()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _key_pem(key), public


@dataclass(frozen=True)
class ClusterPKI:
    """Paths of every file the control plane's flags name."""

    ca_crt: Path
    ca_key: Path
    apiserver_crt: Path
    apiserver_key: Path
    admin_crt: Path
    admin_key: Path
    controller_manager_crt: Path
    controller_manager_key: Path
    scheduler_crt: Path
    scheduler_key: Path
    sa_key: Path
    sa_pub: Path
    front_proxy_ca_crt: Path
    front_proxy_client_crt: Path
    front_proxy_client_key: Path


def generate(directory: Path, *, apiserver_ips: tuple[str, ...] = ()) -> ClusterPKI:
    """Writes a fresh PKI for one local cluster into ``directory``; the API server's
    certificate names ``apiserver_ips`` besides loopback and the ``kubernetes`` Service."""
    ca = make_ca()
    ca_crt, ca_key = ca.write(directory, "ca")
    apiserver = issue(
        ca,
        "kube-apiserver",
        dns_names=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        ip_addresses=("127.0.0.1", "10.96.0.1", *apiserver_ips),
        server=True,
    )
    apiserver_crt, apiserver_key = apiserver.write(directory, "apiserver")
    admin = issue(ca, "kubernetes-admin", organizations=("system:masters",), client=True)
    admin_crt, admin_key = admin.write(directory, "admin")
    kcm = issue(ca, "system:kube-controller-manager", client=True)
    kcm_crt, kcm_key = kcm.write(directory, "controller-manager")
    sched = issue(ca, "system:kube-scheduler", client=True)
    sched_crt, sched_key = sched.write(directory, "scheduler")
    # The aggregation layer's request-header CA: the controller manager's and the scheduler's
    # delegated authentication expect it in kube-system/extension-apiserver-authentication.
    front_proxy_ca = make_ca("front-proxy-ca")
    fp_ca_crt, _ = front_proxy_ca.write(directory, "front-proxy-ca")
    fp_client = issue(front_proxy_ca, "front-proxy-client", client=True)
    fp_client_crt, fp_client_key = fp_client.write(directory, "front-proxy-client")
    sa_private, sa_public = service_account_key()
    sa_key, sa_pub = directory / "sa.key", directory / "sa.pub"
    sa_key.touch(mode=0o600)
    sa_key.write_bytes(sa_private)
    sa_pub.write_bytes(sa_public)
    return ClusterPKI(
        ca_crt=ca_crt,
        ca_key=ca_key,
        apiserver_crt=apiserver_crt,
        apiserver_key=apiserver_key,
        admin_crt=admin_crt,
        admin_key=admin_key,
        controller_manager_crt=kcm_crt,
        controller_manager_key=kcm_key,
        scheduler_crt=sched_crt,
        scheduler_key=sched_key,
        sa_key=sa_key,
        sa_pub=sa_pub,
        front_proxy_ca_crt=fp_ca_crt,
        front_proxy_client_crt=fp_client_crt,
        front_proxy_client_key=fp_client_key,
    )
