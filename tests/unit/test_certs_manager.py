"""The pure parts of `reservoir webhook --manage-certs`: the rotation decision over PEM bytes with the API server's
trusted bundle, the Secret and webhook configurations as data, the Lease decision, loading a pair from memory."""

from __future__ import annotations

import base64
import ssl
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509

from certs import pki
from certs.lease import Step, lease_body, lease_step
from certs.manager import (
    MIN_WAIT,
    Settings,
    injection_patch,
    material_of,
    secret_body,
    trusted_bundle,
    wait_seconds,
)
from certs.rotation import Material, Subject, decide
from webhook.certs_secret import load_pair, pair_of

SUBJECT = Subject("reservoir-webhook", "reservoir-system")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
LIFE, CA_LIFE = timedelta(days=90), timedelta(days=900)


def run(material: Material, at: datetime, trusted: bytes | None = None):
    return decide(material, SUBJECT, now=at, validity=LIFE, ca_validity=CA_LIFE, trusted=trusted)


def certs(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem)


def serves_trusted(material: Material) -> bool:
    serving = certs(material.tls_cert)[0]
    return any(pki.issued_by(serving, ca) for ca in certs(material.bundle))


# --- decide: the rotation over bytes ---

def test_nothing_then_everything_then_nothing_to_do() -> None:
    first = run(Material(), T0)
    assert first.actions == ("created CA", "issued serving certificate")
    assert serves_trusted(first.material) and certs(first.material.bundle) == certs(first.material.ca_cert)
    again = run(first.material, T0 + timedelta(days=1))
    assert again.actions == () and again.material == first.material  # the same bytes: no write
    assert again.next_due == T0 - pki.CLOCK_SKEW + (LIFE + pki.CLOCK_SKEW) * 2 / 3  # the serving renewal


def test_renewal_at_two_thirds_keeps_the_ca_and_the_bundle() -> None:
    first = run(Material(), T0).material
    renewed = run(first, T0 + timedelta(days=61))
    assert renewed.actions == ("issued serving certificate",)
    assert renewed.material.bundle == first.bundle and renewed.material.ca_key == first.ca_key
    assert renewed.material.tls_cert != first.tls_cert and serves_trusted(renewed.material)


def _rotated() -> tuple[Material, Material]:
    material = run(Material(), T0).material
    for day in range(60, 600, 60):  # serving renewals on the way
        material = run(material, T0 + timedelta(days=day), trusted=material.bundle).material
    rotated = run(material, T0 + timedelta(days=601), trusted=material.bundle)
    assert rotated.actions == ("rotated CA (old CA kept in the bundle)",)
    return material, rotated.material


def test_ca_rotation_waits_for_the_new_ca_to_be_trusted_by_the_api_server() -> None:
    before, rotated = _rotated()
    assert len(certs(rotated.bundle)) == 2 and rotated.tls_cert == before.tls_cert
    # the configurations still hold the old bundle: the serving certificate stays on the old CA, however often asked
    waiting = run(rotated, T0 + timedelta(days=602), trusted=before.bundle)
    assert waiting.actions == () and waiting.material == rotated
    assert waiting.next_due == T0 + timedelta(days=602)  # look again after the interval
    # once every webhook trusts the new bundle, the serving certificate moves to the new CA
    moved = run(rotated, T0 + timedelta(days=602), trusted=rotated.bundle)
    assert moved.actions == ("issued serving certificate",)
    assert pki.issued_by(certs(moved.material.tls_cert)[0], certs(moved.material.ca_cert)[0])
    # the old CA leaves the bundle when it expires
    later = run(moved.material, T0 + timedelta(days=901), trusted=moved.material.bundle)
    assert certs(later.material.bundle) == certs(moved.material.ca_cert)


def test_a_serving_certificate_nothing_trusts_is_replaced_at_once_whatever_the_api_server_holds() -> None:
    first = run(Material(), T0).material
    stranger = pki.make_ca("reservoir-webhook-ca", CA_LIFE, now=T0)
    forged = pki.issue(stranger, "x", LIFE, dns_names=SUBJECT.dns_names, server=True, now=T0)
    planted = Material(first.ca_cert, first.ca_key, first.bundle, forged.cert_pem, forged.key_pem)
    assert run(planted, T0, trusted=b"").actions == ("issued serving certificate",)


def test_a_secret_written_by_reservoir_certs_is_taken_over_without_a_failed_request() -> None:
    """`reservoir certs --secret` kept no CA key in the Secret: a new CA joins the bundle, the old pair serves on."""
    first = run(Material(), T0).material
    legacy = Material(bundle=first.bundle, tls_cert=first.tls_cert, tls_key=first.tls_key)
    taken = run(legacy, T0 + timedelta(days=1), trusted=first.bundle)
    assert taken.actions == ("rotated CA (old CA kept in the bundle)",)
    assert taken.material.tls_cert == first.tls_cert and len(certs(taken.material.bundle)) == 2


# --- the Secret and the configurations as data ---

SETTINGS = Settings(secret="reservoir-webhook-tls", namespace="reservoir-system", subject=SUBJECT,
                    configurations=("reservoir",), identity="test")


def test_secret_round_trip_keeps_what_else_it_holds() -> None:
    material = run(Material(), T0).material
    created = secret_body(SETTINGS, material, None)
    assert created["type"] == "kubernetes.io/tls" and created["metadata"] == {
        "name": "reservoir-webhook-tls", "namespace": "reservoir-system"}
    assert set(created["data"]) == {"tls.crt", "tls.key", "ca.crt", "ca-signing.crt", "ca-signing.key"}
    assert material_of(created) == material
    existing = {**created, "metadata": {**created["metadata"], "resourceVersion": "7", "labels": {"a": "b"}},
                "data": {**created["data"], "other": "eA=="}}
    updated = secret_body(SETTINGS, Material(), existing)
    assert updated["metadata"]["resourceVersion"] == "7" and updated["metadata"]["labels"] == {"a": "b"}
    assert updated["data"]["other"] == "eA==" and updated["data"]["tls.crt"] == ""
    assert material_of({"data": {"tls.crt": "not base64!"}}) == Material()
    assert material_of(None) == Material()


def _configuration(*bundles: bytes | None, version: str = "5") -> dict:
    hooks = [{"name": f"h{i}", "clientConfig": {"url": "https://x"} | (
        {"caBundle": base64.b64encode(b).decode()} if b is not None else {})} for i, b in enumerate(bundles)]
    return {"metadata": {"name": "reservoir", "resourceVersion": version}, "webhooks": hooks}


def test_trusted_bundle_is_what_every_webhook_trusts() -> None:
    one, two = run(Material(), T0).material, run(Material(), T0).material
    both = one.bundle + two.bundle
    assert trusted_bundle([]) is None and trusted_bundle([{"webhooks": []}]) is None
    assert trusted_bundle([_configuration(both), _configuration(one.bundle)]) == one.bundle
    assert trusted_bundle([_configuration(both, None)]) == b""  # a webhook with no caBundle trusts none of ours
    assert trusted_bundle([_configuration(b"garbage")]) == b""


def test_injection_patches_only_the_webhooks_that_differ_guarded_by_the_resource_version() -> None:
    bundle = run(Material(), T0).material.bundle
    ops = injection_patch(_configuration(bundle, None, b"old"), bundle)
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "5"}
    assert [op["path"] for op in ops[1:]] == ["/webhooks/1/clientConfig/caBundle", "/webhooks/2/clientConfig/caBundle"]
    assert all(base64.b64decode(op["value"]) == bundle for op in ops[1:])
    assert injection_patch(_configuration(bundle, bundle), bundle) == []


def test_wait_until_due_within_the_interval() -> None:
    assert wait_seconds(T0 + timedelta(seconds=3), T0, 10) == 3
    assert wait_seconds(T0 + timedelta(days=3), T0, 10) == 10
    assert wait_seconds(T0 - timedelta(seconds=3), T0, 10) == MIN_WAIT


# --- the Lease ---

def _lease(holder: str, renewed: datetime, duration: int = 30) -> dict:
    return {"metadata": {"name": "l", "resourceVersion": "9"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "leaseTransitions": 2,
                     "acquireTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                     "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}


def test_lease_steps() -> None:
    assert lease_step(None, "me", T0) is Step.CREATE
    assert lease_step(_lease("me", T0 - timedelta(hours=1)), "me", T0) is Step.RENEW
    assert lease_step(_lease("other", T0 - timedelta(seconds=10)), "me", T0) is Step.WAIT
    assert lease_step(_lease("other", T0 - timedelta(seconds=30)), "me", T0) is Step.TAKE_OVER
    assert lease_step(_lease("", T0), "me", T0) is Step.TAKE_OVER


def test_lease_bodies_carry_the_record_and_the_version_read() -> None:
    created = lease_body(None, Step.CREATE, "me", T0, 30, "l", "ns")
    assert "resourceVersion" not in created["metadata"]
    assert created["spec"] == {"holderIdentity": "me", "leaseDurationSeconds": 30, "leaseTransitions": 0,
                               "acquireTime": "2026-01-01T00:00:00.000000Z", "renewTime": "2026-01-01T00:00:00.000000Z"}
    taken = lease_body(_lease("other", T0 - timedelta(minutes=5)), Step.TAKE_OVER, "me", T0, 30, "l", "ns")
    assert taken["metadata"]["resourceVersion"] == "9"
    assert taken["spec"]["leaseTransitions"] == 3 and taken["spec"]["acquireTime"] == "2026-01-01T00:00:00.000000Z"
    renewed = lease_body(_lease("me", T0 - timedelta(seconds=5)), Step.RENEW, "me", T0, 30, "l", "ns")
    assert renewed["spec"]["leaseTransitions"] == 2 and renewed["spec"]["renewTime"] == "2026-01-01T00:00:00.000000Z"
    assert renewed["spec"]["acquireTime"] != renewed["spec"]["renewTime"]


# --- serving the pair from memory ---

def test_a_pair_is_loaded_from_memory_and_a_mismatched_one_is_refused() -> None:
    material = run(Material(), datetime.now(UTC)).material
    secret = secret_body(SETTINGS, material, None)
    pair = pair_of(secret)
    assert pair == (material.tls_cert, material.tls_key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    load_pair(context, *pair)
    with pytest.raises(ssl.SSLError):
        load_pair(context, material.tls_cert, pki.key_pem(pki.new_key()))
    assert pair_of({"data": {"tls.crt": secret["data"]["tls.crt"]}}) is None
    assert pair_of(None) is None
