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

"Issued by a CA" is decided by the CA's key (the signature verifies with its public key), never by names: two CAs
made the same day share a subject, and a certificate can name any issuer. Private keys are written at mode 0600
from the moment the file exists (see `write_file`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

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
    """The PEM certificates in `path`; none when it is missing or unreadable (what is unreadable is replaced)."""
    try:
        return x509.load_pem_x509_certificates(path.read_bytes())
    except (OSError, ValueError):
        return []


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey | None:
    """The EC private key in `path` (this module writes only ECDSA P-256 keys); None when missing, unreadable or of
    another kind."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), None)
    except (OSError, ValueError, TypeError):
        return None
    return key if isinstance(key, ec.EllipticCurvePrivateKey) else None


def _load_ca(cert_path: Path, key_path: Path) -> pki.KeyPair | None:
    """The current CA, when both files are readable and belong together."""
    key, certs = _load_key(key_path), _load_certs(cert_path)
    if key is None or not certs or not pki.matches(key, certs[0]):
        return None
    return pki.KeyPair(key, certs[0])


def write_file(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` atomically (a reader sees the old file or the new one, never half of one) with `data` at `mode`.

    The temporary file is made by `mkstemp` in the same directory: an unpredictable name, opened with
    O_CREAT|O_EXCL at mode 0600, so a private key is never readable by others for an instant (whatever the umask) and
    a file or symlink planted at a guessable name is never written through. Public files are then widened to `mode`.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            if mode != 0o600:
                os.fchmod(out.fileno(), mode)
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _tighten(path: Path, actions: list[str]) -> None:
    """A private key left readable by others (written by an older version, or by hand) is narrowed to 0600."""
    with contextlib.suppress(OSError):
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
            actions.append(f"narrowed {path.name} to mode 0600")


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
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    actions: list[str] = []
    ca_cert_path, ca_key_path = out_dir / "ca.crt", out_dir / "ca.key"
    bundle_path, tls_cert_path, tls_key_path = out_dir / "ca-bundle.crt", out_dir / "tls.crt", out_dir / "tls.key"
    for key_path in (ca_key_path, tls_key_path):
        _tighten(key_path, actions)

    bundle = [c for c in _load_certs(bundle_path) if c.not_valid_after_utc > now]
    ca = _load_ca(ca_cert_path, ca_key_path)
    ca_rotated = False
    if ca is None or due(ca.cert, now, renew_fraction):
        ca = pki.make_ca(f"reservoir-webhook-ca-{now:%Y%m%d}", ca_validity, now=now)
        write_file(ca_key_path, ca.key_pem, 0o600)
        write_file(ca_cert_path, ca.cert_pem)
        actions.append("created CA" if not bundle else "rotated CA (old CA kept in the bundle)")
        ca_rotated = bool(bundle)
    if ca.cert not in bundle:
        bundle.append(ca.cert)
    write_file(bundle_path, b"".join(_pem(c) for c in bundle))

    serving = _load_certs(tls_cert_path)
    tls_key = _load_key(tls_key_path)
    current = serving[0] if serving and tls_key is not None and pki.matches(tls_key, serving[0]) else None
    if (current is None or due(current, now, 1.0) or not any(pki.issued_by(current, c) for c in bundle)
            or set(subject.dns_names) - set(_sans(current)) or set(subject.ips) - set(_ips(current))):
        reissue = True  # nothing usable is served (missing, expired, not signed by a CA the bundle holds): issue now
    elif ca_rotated:
        reissue = False  # step 2: the bundle with the new CA must reach the apiserver first
    else:
        reissue = due(current, now, renew_fraction) or not pki.issued_by(current, ca.cert)  # renewal, or step 3
    if reissue:
        pair = pki.issue(ca, subject.dns_names[2], validity, dns_names=subject.dns_names, ip_addresses=subject.ips,
                         server=True, now=now)
        write_file(tls_key_path, pair.key_pem, 0o600)
        write_file(tls_cert_path, pair.cert_pem)
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
