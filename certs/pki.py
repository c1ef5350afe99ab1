"""Small PKI: a self-signed CA, certificates it issues, PEM encoding. ECDSA P-256 keys throughout."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Backdate every certificate a little, so a clock a few seconds behind does not reject a fresh one.
CLOCK_SKEW = timedelta(minutes=5)


@dataclass(frozen=True)
class KeyPair:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def key_pem(self) -> bytes:
        return key_pem(self.key)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def public_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    """True when `issuer`'s key signed `cert` (and `cert` names `issuer` as its issuer). A name alone proves
    nothing: two CAs made the same day have the same subject, and anyone can write any issuer name."""
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def matches(key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> bool:
    """True when `cert` certifies `key`'s public key (the pair on disk belongs together)."""
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    return (cert.public_key().public_bytes(serialization.Encoding.PEM, spki)
            == key.public_key().public_bytes(serialization.Encoding.PEM, spki))


def _name(common_name: str, organizations: Iterable[str] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def make_ca(common_name: str, valid_for: timedelta, now: datetime | None = None) -> KeyPair:
    """A self-signed CA certificate valid from now (less CLOCK_SKEW) for `valid_for`."""
    now = now or datetime.now(UTC)
    key = new_key()
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + valid_for)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(key, cert)


def issue(
    ca: KeyPair,
    common_name: str,
    valid_for: timedelta,
    *,
    organizations: Iterable[str] = (),
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str] = (),
    server: bool = False,
    client: bool = False,
    now: datetime | None = None,
) -> KeyPair:
    """A leaf certificate signed by `ca`, for serving (SANs) and/or client authentication (CN, O = groups)."""
    now = now or datetime.now(UTC)
    key = new_key()
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organizations))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(min(now + valid_for, ca.cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_encipherment=False, key_cert_sign=False, crl_sign=False,
                content_commitment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return KeyPair(key, builder.sign(ca.key, hashes.SHA256()))
