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


@dataclass(frozen=True)
class Material:
    """The webhook's certificates as PEM bytes, wherever they are kept (files, a Secret); b"" for what is missing.
    `bundle` is every CA the API server should trust (what goes into caBundle); `ca_cert`/`ca_key` the current CA,
    which signs; `tls_cert`/`tls_key` the serving pair."""

    ca_cert: bytes = b""
    ca_key: bytes = b""
    bundle: bytes = b""
    tls_cert: bytes = b""
    tls_key: bytes = b""


@dataclass(frozen=True)
class Decision:
    """What `decide` made of a Material: the Material to keep (equal to the input when nothing was due), what was
    done, and when to look again (the next renewal or rotation time, or an expiry that changes the bundle)."""

    material: Material
    actions: tuple[str, ...]
    next_due: datetime


def _load_pem_certs(data: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(data) if data.strip() else []
    except ValueError:
        return []


def _load_pem_key(data: bytes) -> ec.EllipticCurvePrivateKey | None:
    try:
        key = serialization.load_pem_private_key(data, None) if data.strip() else None
    except (ValueError, TypeError):
        return None
    return key if isinstance(key, ec.EllipticCurvePrivateKey) else None


def _pair(cert_pem: bytes, key_pem: bytes) -> pki.KeyPair | None:
    """The pair, when both parse and belong together (the first certificate of `cert_pem` certifies the key)."""
    key, certs = _load_pem_key(key_pem), _load_pem_certs(cert_pem)
    if key is None or not certs or not pki.matches(key, certs[0]):
        return None
    return pki.KeyPair(key, certs[0])


def decide(current: Material, subject: Subject, *, now: datetime, validity: timedelta = DEFAULT_VALIDITY,
           ca_validity: timedelta = DEFAULT_CA_VALIDITY, renew_fraction: float = DEFAULT_RENEW_FRACTION,
           trusted: bytes | None = None) -> Decision:
    """Create or renew what is due; a pure decision over PEM bytes (new keys are the only randomness).

    - CA: made when missing or unreadable, rotated once `renew_fraction` of its life has passed (`due`): the new
      CA joins the bundle beside the old one (rotation step 2); expired CAs leave the bundle.
    - Serving pair: issued at once when nothing usable is served (missing, expired, key and certificate apart, not
      signed by a CA of the bundle, SANs short of `subject`); renewed at `renew_fraction`; moved to the current CA
      (step 3) once the API server trusts it. `trusted` is the bundle the API server is known to hold (the
      webhook configurations' caBundle): step 3 waits until it holds the current CA. None (files written by
      `reservoir certs`, injected by the same run): step 3 waits one run after the rotation.
    """
    actions: list[str] = []
    bundle = [c for c in _load_pem_certs(current.bundle) if c.not_valid_after_utc > now]
    ca = _pair(current.ca_cert, current.ca_key)
    ca_rotated = False
    if ca is None or due(ca.cert, now, renew_fraction):
        ca = pki.make_ca(f"reservoir-webhook-ca-{now:%Y%m%d}", ca_validity, now=now)
        actions.append("created CA" if not bundle else "rotated CA (old CA kept in the bundle)")
        ca_rotated = bool(bundle)
    if ca.cert not in bundle:
        bundle.append(ca.cert)

    serving = _pair(current.tls_cert, current.tls_key)
    if (serving is None or due(serving.cert, now, 1.0) or not any(pki.issued_by(serving.cert, c) for c in bundle)
            or set(subject.dns_names) - set(_sans(serving.cert)) or set(subject.ips) - set(_ips(serving.cert))):
        reissue = True  # nothing usable is served (missing, expired, not signed by a CA the bundle holds): issue now
    elif ca_rotated:
        reissue = False  # step 2: the bundle with the new CA must reach the API server first
    elif not pki.issued_by(serving.cert, ca.cert):
        reissue = trusted is None or ca.cert in _load_pem_certs(trusted)  # step 3, once the new CA is trusted
    else:
        reissue = due(serving.cert, now, renew_fraction)  # renewal
    if reissue:
        serving = pki.issue(ca, subject.dns_names[2], validity, dns_names=subject.dns_names, ip_addresses=subject.ips,
                            server=True, now=now)
        actions.append("issued serving certificate")
    assert serving is not None

    def keep(new: bytes, old: bytes) -> bytes:
        return old if new == old else new

    material = Material(
        ca_cert=keep(ca.cert_pem, current.ca_cert), ca_key=keep(ca.key_pem, current.ca_key),
        bundle=keep(b"".join(_pem(c) for c in bundle), current.bundle),
        tls_cert=keep(serving.cert_pem, current.tls_cert), tls_key=keep(serving.key_pem, current.tls_key))
    return Decision(material, tuple(actions), _next_due(ca.cert, serving.cert, bundle, renew_fraction, now))


def _next_due(ca: x509.Certificate, serving: x509.Certificate, bundle: list[x509.Certificate],
              renew_fraction: float, now: datetime) -> datetime:
    """The earliest moment `decide` would do something again with no outside change: the CA's rotation, the serving
    certificate's renewal, an old CA's expiry (it leaves the bundle). A serving certificate waiting for the new CA
    to be trusted (step 3) is `now`: the caller looks again after its own interval."""
    def at(cert: x509.Certificate, fraction: float) -> datetime:
        start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
        return start + (end - start) * fraction

    moments = [at(ca, renew_fraction), at(serving, renew_fraction)]
    moments += [c.not_valid_after_utc for c in bundle if c != ca]
    if not pki.issued_by(serving, ca):
        moments.append(now)
    return max(now, min(moments))


@dataclass
class Outcome:
    actions: list[str]
    bundle: bytes


FILES = {"ca_cert": "ca.crt", "ca_key": "ca.key", "bundle": "ca-bundle.crt", "tls_cert": "tls.crt",
         "tls_key": "tls.key"}
_KEYS = ("ca_key", "tls_key")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def ensure(out_dir: Path, subject: Subject, *, now: datetime | None = None, validity: timedelta = DEFAULT_VALIDITY,
           ca_validity: timedelta = DEFAULT_CA_VALIDITY, renew_fraction: float = DEFAULT_RENEW_FRACTION) -> Outcome:
    """Create or renew what is due in `out_dir` (`decide` over the files); return what was done and the CA bundle to
    inject. A file is written only when its content changes (keys before certificates, keys at 0600)."""
    now = now or datetime.now(UTC)
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    actions: list[str] = []
    for key in _KEYS:
        _tighten(out_dir / FILES[key], actions)
    current = Material(**{field: _read(out_dir / name) for field, name in FILES.items()})
    decision = decide(current, subject, now=now, validity=validity, ca_validity=ca_validity,
                      renew_fraction=renew_fraction)
    for field in ("ca_key", "ca_cert", "bundle", "tls_key", "tls_cert"):
        data = getattr(decision.material, field)
        if data != getattr(current, field) or not (out_dir / FILES[field]).exists():
            write_file(out_dir / FILES[field], data, 0o600 if field in _KEYS else 0o644)
    return Outcome(actions + list(decision.actions), decision.material.bundle)


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
