"""TLS interception for the hosts a run's secrets are bound to: a certificate authority of the
run's own, made on the host when the run starts and forgotten when it ends.

Only its certificate enters the sandbox (in a bundle with the system's CAs that the run's
TLS clients are pointed at); its key stays in the host's memory. The proxy ends the run's
TLS with a certificate this CA issues for the host asked for, and opens its own TLS to the
host, verified against the system's trust store (or the operator's `network_ca`).
Imported at the first run with bound secrets: `cryptography` takes a while to import.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import ssl
from collections.abc import Iterator, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SKEW = datetime.timedelta(minutes=5)  # a run's clock reads the host's; a margin for its checks
_PEM = serialization.Encoding.PEM


def system_cas() -> bytes:
    """The host's CA bundle as OpenSSL finds it (empty when it has none)."""
    paths = ssl.get_default_verify_paths()
    for path in (paths.cafile, paths.openssl_cafile):
        if path and os.path.isfile(path):
            with open(path, "rb") as fh:
                return fh.read()
    return b""


def upstream_context(cafile: str | None) -> ssl.SSLContext:
    """How the proxy verifies the hosts it opens TLS to: the system's trust store, or only
    the CAs of `cafile` (an operator's internal CA, a test's)."""
    context = ssl.create_default_context(cafile=cafile)
    context.set_alpn_protocols(["http/1.1"])
    return context


class RunCA:
    """One run's certificate authority (ECDSA P-256, valid for the run's time and a few
    minutes), and the server contexts it makes for the hosts the run's secrets are bound to.
    Given the bound `names` (`*.domain` too), its certificate is constrained to them: a
    client checking name constraints trusts nothing else it might sign."""

    def __init__(self, system: bytes, valid_s: float, names: Sequence[str] = ()) -> None:
        now = datetime.datetime.now(datetime.UTC)
        self._start = now - SKEW
        self._end = now + datetime.timedelta(seconds=valid_s) + SKEW
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "execbox run CA")])
        self._name = name
        builder = (
            self._builder(name, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(cert_sign=True), critical=True)
        )
        if names:
            builder = builder.add_extension(_constraints(names), critical=True)
        self.cert = builder.sign(self._key, hashes.SHA256())
        self.pem = self.cert.public_bytes(_PEM)
        self.bundle = system.rstrip(b"\n") + b"\n" + self.pem if system else self.pem
        # One key for every host's certificate of the run: the client never sees more.
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._contexts: dict[str, ssl.SSLContext] = {}

    def _builder(
        self, subject: x509.Name, key: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._start)
            .not_valid_after(self._end)
        )

    def server_context(self, host: str) -> ssl.SSLContext:
        """A server context presenting a certificate for `host` (made at its first use; two
        threads asking at once may each make one, and either serves)."""
        context = self._contexts.get(host)
        if context is None:
            context = self._contexts[host] = self._make_context(host)
        return context

    def _make_context(self, host: str) -> ssl.SSLContext:
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
        cert = (
            self._builder(subject, self._leaf_key.public_key())
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .sign(self._key, hashes.SHA256())
        )
        key = self._leaf_key.private_bytes(
            _PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        with _memory_file(cert.public_bytes(_PEM) + key) as path:
            context.load_cert_chain(path)
        return context


def _constraints(names: Sequence[str]) -> x509.NameConstraints:
    """Names only (a leading '.' is the names under a domain, not the domain), no address."""
    permitted: list[x509.GeneralName] = [
        x509.DNSName(n[1:] if n.startswith("*.") else n) for n in sorted(set(names))
    ]
    excluded: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_network("0.0.0.0/0")),
        x509.IPAddress(ipaddress.ip_network("::/0")),
    ]
    return x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=excluded)


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


@contextlib.contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """A path to `data` that never touches a disk (ssl loads a chain only from a path)."""
    fd = os.memfd_create("execbox-run-cert", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)
