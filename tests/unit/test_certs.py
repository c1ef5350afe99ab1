"""Certificate lifecycle: create, renew at 2/3 of the lifetime, rotate the CA without a failed request."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from certs.rotation import Subject, due, ensure

SUBJECT = Subject("reservoir-webhook", "reservoir-system", ips=("127.0.0.1",))
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
CA_LIFE = timedelta(days=900)


def load(path: Path) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(path.read_bytes())


def verifies(ca: x509.Certificate, cert: x509.Certificate) -> bool:
    try:
        ca.public_key().verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))
        return True
    except Exception:
        return False


def trusted(out: Path) -> bool:
    serving = load(out / "tls.crt")[0]
    return any(verifies(ca, serving) for ca in load(out / "ca-bundle.crt"))


def test_first_run_creates_everything_with_sans(tmp_path: Path) -> None:
    outcome = ensure(tmp_path, SUBJECT, now=T0)
    assert outcome.actions == ["created CA", "issued serving certificate"]
    serving = load(tmp_path / "tls.crt")[0]
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "reservoir-webhook.reservoir-system.svc" in sans.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert trusted(tmp_path)
    assert (tmp_path / "tls.key").stat().st_mode & 0o777 == 0o600
    assert ensure(tmp_path, SUBJECT, now=T0 + timedelta(days=1)).actions == []


def test_serving_certificate_renewed_at_two_thirds(tmp_path: Path) -> None:
    ensure(tmp_path, SUBJECT, now=T0)
    serving = load(tmp_path / "tls.crt")[0]
    assert not due(serving, T0 + timedelta(days=240), 2 / 3)
    assert ensure(tmp_path, SUBJECT, now=T0 + timedelta(days=240)).actions == []
    assert ensure(tmp_path, SUBJECT, now=T0 + timedelta(days=246)).actions == ["issued serving certificate"]
    assert trusted(tmp_path)


def test_ca_rotation_keeps_the_old_ca_until_the_new_one_serves(tmp_path: Path) -> None:
    ensure(tmp_path, SUBJECT, now=T0, ca_validity=CA_LIFE)
    ensure(tmp_path, SUBJECT, now=T0 + timedelta(days=250), ca_validity=CA_LIFE)
    old_serving = load(tmp_path / "tls.crt")[0]
    # the CA reaches 2/3: a new CA joins the bundle, the served certificate does not change yet
    rotated = ensure(tmp_path, SUBJECT, now=T0 + timedelta(days=601), ca_validity=CA_LIFE)
    assert rotated.actions == ["rotated CA (old CA kept in the bundle)"]
    assert len(load(tmp_path / "ca-bundle.crt")) == 2
    assert load(tmp_path / "tls.crt")[0] == old_serving and trusted(tmp_path)
    # next run: the serving certificate moves to the new CA, still trusted by the bundle
    moved = ensure(tmp_path, SUBJECT, now=T0 + timedelta(days=602), ca_validity=CA_LIFE)
    assert moved.actions == ["issued serving certificate"]
    new_ca = load(tmp_path / "ca.crt")[0]
    assert verifies(new_ca, load(tmp_path / "tls.crt")[0])
    # once the old CA has expired it leaves the bundle
    ensure(tmp_path, SUBJECT, now=T0 + timedelta(days=901), ca_validity=CA_LIFE)
    assert load(tmp_path / "ca-bundle.crt") == [new_ca]


def test_new_san_forces_a_new_certificate(tmp_path: Path) -> None:
    ensure(tmp_path, SUBJECT, now=T0)
    wider = Subject("reservoir-webhook", "reservoir-system", extra_dns=("webhook.example",), ips=("127.0.0.1",))
    assert ensure(tmp_path, wider, now=T0).actions == ["issued serving certificate"]
