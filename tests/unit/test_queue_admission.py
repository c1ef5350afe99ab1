"""A queue admits a namespace before the namespace may use the queue (shared.entitlement.admitted_queue): naming a
queue whose Queue lists other namespaces (`reservoir.sh/namespaces`) opens nothing that the queue's name opens: not
its lock, not a window limited to it, not backfill's `queues`, not the queue's usage, rank or PriorityClass."""
from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from agent.planner.capacity import node_states
from agent.planner.jobs import NO_QUEUE, build_jobs, usage_by_queue
from agent.planner.ordering import order_jobs, score_queues
from shared import keys
from shared.backfill import hold_refusal
from shared.config import load_config
from shared.entitlement import Grounds, admitted_queue, entitlement, honoured_queue
from shared.ownership import queue_owner_id, window_owner_id
from tests import builders
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


def test_a_pod_of_another_namespace_counts_for_no_queue_in_usage_or_queue_order() -> None:
    """The queue's usage (seed 001 "allocated", seed 002 "queue already used") and its jobs' place in queue order
    count the pods the Queue admits, nothing else: a team-b pod naming gold neither fills gold's guarantee nor takes
    gold's rank for its own job."""
    running = replace(builders.pod("b-run", "2", node_name="n1", ns="team-b"), annotations=NAMING_GOLD)
    own = replace(builders.pod("a-run", "1", node_name="n1", ns="team-a"), annotations=NAMING_GOLD)
    waiting_b = replace(builders.pod("b-wait", "1", ns="team-b", age=timedelta(hours=1)), annotations=NAMING_GOLD)
    waiting_a = replace(builders.pod("a-wait", "1", ns="team-a"), annotations=NAMING_GOLD)
    plain = builders.pod("c-wait", "1", ns="team-c", age=timedelta(minutes=30))
    snapshot = replace(builders.snap([builders.node("n1")], [running, own, waiting_b, waiting_a, plain]),
                       queues={**GOLD_FOR_TEAM_A, keys.DEFAULT_QUEUE: queue(keys.DEFAULT_QUEUE)})
    states = node_states(snapshot.nodes, snapshot.pods)
    usage = usage_by_queue(states, snapshot.podgroups, snapshot.queues)
    assert usage["gold"] == {"n1": own.requests}, usage
    assert usage[NO_QUEUE] == {"n1": running.requests}
    jobs = {j.ref.name: j for j in build_jobs(snapshot)}
    assert (jobs["a-wait"].queue, jobs["b-wait"].queue, jobs["c-wait"].queue) == ("gold", NO_QUEUE, "default")
    scores = score_queues(snapshot, states, {j.queue for j in jobs.values()}, CONFIG.queue_order, usage)
    assert NO_QUEUE not in {s.name for s in scores}
    ordered = [j.ref.name for j in order_jobs(jobs.values(), scores, "queue-first")]
    assert ordered[-1] == "b-wait", f"the oldest job, naming a queue that does not admit it, ranks last: {ordered}"


def test_a_name_no_queue_backs_is_no_queue_of_its_own() -> None:
    """A pod naming a queue no Queue object has (other than the default queue, Volcano's, assumed when absent) counts
    for no queue: it would otherwise be a queue of its own with no usage, ranked ahead of every real one."""
    assert honoured_queue("ghost-xyz", GOLD_FOR_TEAM_A, "team-a") is None
    assert honoured_queue(keys.DEFAULT_QUEUE, {}, "team-a") == keys.DEFAULT_QUEUE
    assert honoured_queue("gold", GOLD_FOR_TEAM_A, "team-a") == "gold"
    ghost = replace(builders.pod("ghost", "1", ns="team-a", age=timedelta(minutes=30)),
                    annotations={keys.QUEUE_NAME: "ghost-xyz"})
    older = builders.pod("older", "1", ns="team-b", age=timedelta(hours=5))
    busy = builders.pod("busy", "4", node_name="n1", ns="team-b")  # the default queue's usage: it scores lower
    snapshot = replace(builders.snap([builders.node("n1")], [ghost, older, busy]),
                       queues={keys.DEFAULT_QUEUE: queue(keys.DEFAULT_QUEUE)})
    states = node_states(snapshot.nodes, snapshot.pods)
    usage = usage_by_queue(states, snapshot.podgroups, snapshot.queues)
    jobs = {j.ref.name: j for j in build_jobs(snapshot)}
    assert jobs["ghost"].queue == NO_QUEUE
    scores = score_queues(snapshot, states, {j.queue for j in jobs.values()}, CONFIG.queue_order, usage)
    assert [s.name for s in scores] == [keys.DEFAULT_QUEUE]
    assert [j.ref.name for j in order_jobs(jobs.values(), scores, "queue-first")] == ["older", "ghost"]
    # backfill.queues is not entered by it either (the webhook's gate and the agent's decision read it alike)
    opting_in = {keys.QUEUE_NAME: "ghost", keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: "60s"}
    ghost_listed = CONFIG.backfill.model_copy(update={"queues": ["ghost"]})
    assert hold_refusal(opting_in, {}, namespace="team-a", config=ghost_listed,
                        queue=honoured_queue("ghost", {}, "team-a"))
