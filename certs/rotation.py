"""Certificate lifecycle for the webhook, as a pure decision plus file I/O at the edge.

Files in the output directory: `ca.crt` + `ca.key` (the current CA), `ca-bundle.crt` (every CA the apiserver
should trust: what goes into caBundle), `tls.crt` + `tls.key` (the serving pair).

Rotation without a failed request:
1. the serving certificate is renewed at `renew_fraction` of its lifetime, signed by the current CA (already
   trusted: no caBundle change);
2. the CA is renewed at `renew_fraction` of its lifetime: a new CA joins the bundle next to the old one, and the
   serving certificate stays on the old CA for this run;
3. on the next run, once the bundle with the new CA has been injected, the serving certificate is re-issued by
   the new CA; the old CA leaves the bundle when it expires.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certs import pki

DEFAULT_VALIDITY = timedelta(days=365)
DEFAULT_CA_VALIDITY = timedelta(days=3650)
DEFAULT_RENEW_FRACTION = 2 / 3


@dataclass(frozen=True)
class Subject:
    service: str
    namespace: str
    extra_dns: tuple[str, ...] = ()
    ips: tuple[str, ...] = ()

    @property
    def dns_names(self) -> list[str]:
        base = [self.service, f"{self.service}.{self.namespace}", f"{self.service}.{self.namespace}.svc",
                f"{self.service}.{self.namespace}.svc.cluster.local"]
        return base + list(self.extra_dns)


def due(cert: x509.Certificate, now: datetime, fraction: float) -> bool:
    """True once `fraction` of the certificate's lifetime has passed (or it is already expired)."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now >= start + (end - start) * fraction


def _load_certs(path: Path) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(path.read_bytes()) if path.exists() else []


def _write(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, path)  # atomic: a reader sees the old file or the new one, never half of one


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass
class Outcome:
    actions: list[str]
    bundle: bytes


def ensure(out_dir: Path, subject: Subject, *, now: datetime | None = None, validity: timedelta = DEFAULT_VALIDITY,
           ca_validity: timedelta = DEFAULT_CA_VALIDITY, renew_fraction: float = DEFAULT_RENEW_FRACTION) -> Outcome:
    """Create or renew what is due in `out_dir`; return what was done and the CA bundle to inject."""
    now = now or datetime.now(UTC)
    out_dir.mkdir(parents=True, exist_ok=True)
    actions: list[str] = []
    ca_cert_path, ca_key_path = out_dir / "ca.crt", out_dir / "ca.key"
    bundle_path, tls_cert_path, tls_key_path = out_dir / "ca-bundle.crt", out_dir / "tls.crt", out_dir / "tls.key"

    bundle = [c for c in _load_certs(bundle_path) if c.not_valid_after_utc > now]
    if ca_cert_path.exists() and ca_key_path.exists():
        # ca.key is always one this module wrote (pki.new_key: ECDSA P-256), so the loaded key is an EC key
        ca_key = cast(ec.EllipticCurvePrivateKey, serialization.load_pem_private_key(ca_key_path.read_bytes(), None))
        ca = pki.KeyPair(ca_key, x509.load_pem_x509_certificate(ca_cert_path.read_bytes()))
    else:
        ca = None
    ca_rotated = False
    if ca is None or due(ca.cert, now, renew_fraction):
        ca = pki.make_ca(f"reservoir-webhook-ca-{now:%Y%m%d}", ca_validity, now=now)
        _write(ca_key_path, ca.key_pem, 0o600)
        _write(ca_cert_path, ca.cert_pem)
        actions.append("created CA" if not bundle else "rotated CA (old CA kept in the bundle)")
        ca_rotated = bool(bundle)
    if ca.cert not in bundle:
        bundle.append(ca.cert)
    _write(bundle_path, b"".join(_pem(c) for c in bundle))

    serving = _load_certs(tls_cert_path)
    current = serving[0] if serving and tls_key_path.exists() else None
    trusted_issuers = {c.subject for c in bundle}
    if (current is None or due(current, now, 1.0) or current.issuer not in trusted_issuers
            or set(subject.dns_names) - set(_sans(current)) or set(subject.ips) - set(_ips(current))):
        reissue = True  # nothing usable is served: issue now
    elif ca_rotated:
        reissue = False  # step 2: the bundle with the new CA must reach the apiserver first
    else:
        reissue = due(current, now, renew_fraction) or current.issuer != ca.cert.subject  # renewal, or step 3
    if reissue:
        pair = pki.issue(ca, subject.dns_names[2], validity, dns_names=subject.dns_names, ip_addresses=subject.ips,
                         server=True, now=now)
        _write(tls_key_path, pair.key_pem, 0o600)
        _write(tls_cert_path, pair.cert_pem)
        actions.append("issued serving certificate")
    return Outcome(actions, bundle_path.read_bytes())


def _sans(cert: x509.Certificate) -> list[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return ext.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        return []


def _ips(cert: x509.Certificate) -> list[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return [str(ip) for ip in ext.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        return []
