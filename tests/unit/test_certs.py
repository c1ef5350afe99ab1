"""Certificate lifecycle: create, renew at 2/3 of the lifetime, rotate the CA without a failed request."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec

from certs.rotation import Subject, due, ensure

SUBJECT = Subject("reservoir-webhook", "reservoir-system", ips=("127.0.0.1",))
T0 = datetime(2026, 1, 1, tzinfo=UTC)
CA_LIFE = timedelta(days=900)


def load(path: Path) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(path.read_bytes())


def verifies(ca: x509.Certificate, cert: x509.Certificate) -> bool:
    """`cert`'s signature is `ca`'s; False only for a signature that does not verify (any other error fails the
    test: a key that is not ECDSA, a certificate that cannot be read)."""
    key = ca.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and cert.signature_hash_algorithm is not None
    try:
        key.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))
        return True
    except InvalidSignature:
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


# --- trust by key, not by name (issue 10) ---

def _forge_serving(out: Path, issuer_name_from: x509.Certificate) -> None:
    """A serving pair whose issuer name is that of `issuer_name_from` but signed by another key: a CA made the same
    day (same subject), or a forgery."""
    from cryptography.x509.oid import NameOID

    from certs import pki

    impostor = pki.make_ca(issuer_name_from.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value,
                           timedelta(days=3650), now=T0)
    assert impostor.cert.subject == issuer_name_from.subject
    pair = pki.issue(impostor, SUBJECT.dns_names[2], timedelta(days=365), dns_names=SUBJECT.dns_names,
                     ip_addresses=SUBJECT.ips, server=True, now=T0)
    assert pair.cert.issuer == issuer_name_from.subject
    (out / "tls.crt").write_bytes(pair.cert_pem)
    (out / "tls.key").write_bytes(pair.key_pem)
    (out / "tls.key").chmod(0o600)


def test_issued_by_checks_the_signature_not_the_name() -> None:
    from certs import pki

    ca = pki.make_ca("same-name", timedelta(days=10), now=T0)
    twin = pki.make_ca("same-name", timedelta(days=10), now=T0)
    leaf = pki.issue(ca, "svc", timedelta(days=1), dns_names=["svc"], server=True, now=T0)
    assert pki.issued_by(leaf.cert, ca.cert)
    assert leaf.cert.issuer == twin.cert.subject and not pki.issued_by(leaf.cert, twin.cert)
    assert not pki.issued_by(ca.cert, leaf.cert)  # a leaf signs nothing
    assert pki.matches(leaf.key, leaf.cert) and not pki.matches(twin.key, leaf.cert)


def test_serving_cert_with_matching_issuer_name_but_another_key_is_renewed(tmp_path: Path) -> None:
    ensure(tmp_path, SUBJECT, now=T0)
    ca = load(tmp_path / "ca.crt")[0]
    _forge_serving(tmp_path, ca)
    assert not trusted(tmp_path)
    outcome = ensure(tmp_path, SUBJECT, now=T0 + timedelta(days=1))
    assert outcome.actions == ["issued serving certificate"]
    assert trusted(tmp_path) and verifies(ca, load(tmp_path / "tls.crt")[0])


def test_ca_recreated_the_same_day_gets_a_new_serving_cert(tmp_path: Path) -> None:
    """The CA files are lost and made again on the same day: same subject, new key; the old serving certificate
    names the new CA as issuer but no CA in the bundle signed it any more."""
    ensure(tmp_path, SUBJECT, now=T0)
    for name in ("ca.crt", "ca.key", "ca-bundle.crt"):
        (tmp_path / name).unlink()
    outcome = ensure(tmp_path, SUBJECT, now=T0 + timedelta(hours=1))
    assert outcome.actions == ["created CA", "issued serving certificate"]
    assert trusted(tmp_path)


def test_serving_key_that_does_not_match_the_cert_is_reissued(tmp_path: Path) -> None:
    from certs import pki

    ensure(tmp_path, SUBJECT, now=T0)
    (tmp_path / "tls.key").write_bytes(pki.key_pem(pki.new_key()))
    assert ensure(tmp_path, SUBJECT, now=T0).actions == ["issued serving certificate"]


def test_ca_key_that_does_not_match_the_ca_cert_is_replaced(tmp_path: Path) -> None:
    from certs import pki

    ensure(tmp_path, SUBJECT, now=T0)
    (tmp_path / "ca.key").write_bytes(pki.key_pem(pki.new_key()))
    outcome = ensure(tmp_path, SUBJECT, now=T0)
    assert outcome.actions[0] == "rotated CA (old CA kept in the bundle)"
    assert trusted(tmp_path)
    # the serving certificate moves to the new CA on the next run, as after any rotation
    assert ensure(tmp_path, SUBJECT, now=T0).actions == ["issued serving certificate"]
    assert verifies(load(tmp_path / "ca.crt")[0], load(tmp_path / "tls.crt")[0])


# --- private keys: 0600 from the start, no predictable temporary names ---

def test_keys_are_never_written_readable_by_others(tmp_path: Path, monkeypatch) -> None:
    import os

    from certs import rotation

    seen: list[tuple[str, str, int]] = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append((Path(src).name, Path(dst).name, os.stat(src).st_mode & 0o777))
        return real_replace(src, dst)

    monkeypatch.setattr(rotation.os, "replace", replace)
    old_umask = os.umask(0)  # the most permissive umask: modes come from the code, not the environment
    try:
        ensure(tmp_path, SUBJECT, now=T0)
    finally:
        os.umask(old_umask)
    modes = {dst: mode for _, dst, mode in seen}
    assert modes == {"ca.key": 0o600, "ca.crt": 0o644, "ca-bundle.crt": 0o644, "tls.key": 0o600, "tls.crt": 0o644}
    temporaries = [src for src, _, _ in seen]
    assert all(src.startswith(f".{dst}.") and src != f".{dst}.tmp" for src, dst, _ in seen)
    assert len(set(temporaries)) == len(temporaries)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca-bundle.crt", "ca.crt", "ca.key", "tls.crt", "tls.key"]
    for name in ("ca.key", "tls.key"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600


def test_keys_are_created_with_mode_0600_by_the_open_itself(tmp_path: Path, monkeypatch) -> None:
    """No chmod after the fact: the file is 0600 from the moment it exists (mkstemp opens O_CREAT|O_EXCL, 0600)."""
    import os
    import tempfile

    from certs import rotation

    created: list[int] = []
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        fd, name = real_mkstemp(*args, **kwargs)
        created.append(os.fstat(fd).st_mode & 0o777)
        return fd, name

    monkeypatch.setattr(rotation.tempfile, "mkstemp", mkstemp)
    ensure(tmp_path, SUBJECT, now=T0)
    assert created and set(created) == {0o600}


def test_a_planted_symlink_at_the_old_temporary_name_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    out = tmp_path / "certs"
    out.mkdir()
    for name in ("ca.key", "tls.key", "ca.crt", "tls.crt", "ca-bundle.crt"):
        (out / f".{name}.tmp").symlink_to(victim)
    ensure(out, SUBJECT, now=T0)
    assert victim.read_bytes() == b"untouched"
    assert trusted(out)


def test_a_key_left_readable_by_others_is_narrowed(tmp_path: Path) -> None:
    ensure(tmp_path, SUBJECT, now=T0)
    (tmp_path / "tls.key").chmod(0o644)
    assert ensure(tmp_path, SUBJECT, now=T0).actions == ["narrowed tls.key to mode 0600"]
    assert (tmp_path / "tls.key").stat().st_mode & 0o777 == 0o600


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path, monkeypatch) -> None:
    import pytest

    from certs import rotation

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(rotation.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        ensure(tmp_path, SUBJECT, now=T0)
    assert list(tmp_path.iterdir()) == []
