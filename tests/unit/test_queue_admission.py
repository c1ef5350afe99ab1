"""A queue admits a namespace before the namespace may use the queue (shared.entitlement.admitted_queue): naming a
queue whose Queue lists other namespaces (`reservoir.sh/namespaces`) opens nothing that the queue's name opens: not
its lock, not a window limited to it, not backfill's `queues`."""
from __future__ import annotations

from shared import keys
from shared.backfill import hold_refusal
from shared.config import load_config
from shared.entitlement import Grounds, admitted_queue, entitlement
from shared.ownership import queue_owner_id, window_owner_id
from tests.unit.test_entitlement import pod, queue

CONFIG = load_config("""
windows:
- {name: gold-window, resources: {cpu: "1"}, schedule: "0 3 * * *", duration: 1h, queues: [gold]}
backfill: {queues: [gold]}
""")
GOLD_FOR_TEAM_A = {"gold": queue("gold", "team-a")}
NAMING_GOLD = {keys.QUEUE_NAME: "gold"}


def test_a_queue_admits_only_the_namespaces_it_lists() -> None:
    assert admitted_queue("gold", GOLD_FOR_TEAM_A, "team-a") == "gold"
    assert admitted_queue("gold", GOLD_FOR_TEAM_A, "team-b") is None
    assert admitted_queue("gold", {"gold": queue("gold")}, "team-b") == "gold"  # no list: every namespace, as Volcano
    assert admitted_queue("silver", GOLD_FOR_TEAM_A, "team-b") == "silver"  # no Queue object: nothing lists


def test_a_reserve_pod_of_another_namespace_naming_the_queue_is_no_reserve_pod_of_its_window() -> None:
    grounds = Grounds(config=CONFIG, queues=GOLD_FOR_TEAM_A)
    reserve = pod(annotations={**NAMING_GOLD, keys.RESERVEABLE: "true"}, requests={"cpu": "1"})
    admitted = entitlement(reserve, "team-a", grounds).owners
    assert {window_owner_id("gold-window"), queue_owner_id("gold")} <= admitted.keys()
    stranger = entitlement(reserve, "team-b", grounds).owners
    assert window_owner_id("gold-window") not in stranger and queue_owner_id("gold") not in stranger, stranger


def test_backfill_queues_are_entered_only_through_an_admitting_queue() -> None:
    opting_in = {**NAMING_GOLD, keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: "60s"}

    def refusal(namespace: str) -> str | None:
        return hold_refusal(opting_in, {}, namespace=namespace, config=CONFIG.backfill,
                            queue=admitted_queue("gold", GOLD_FOR_TEAM_A, namespace))
    assert refusal("team-a") is None
    why = refusal("team-b")
    assert why and "does not admit the namespace" in why, why
    # a wildcard of queues is no way around it
    wildcard = CONFIG.backfill.model_copy(update={"queues": ["*"]})
    assert not wildcard.covers("team-b", admitted_queue("gold", GOLD_FOR_TEAM_A, "team-b"))
    assert wildcard.covers("team-a", admitted_queue("gold", GOLD_FOR_TEAM_A, "team-a"))
