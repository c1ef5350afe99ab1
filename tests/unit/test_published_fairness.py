"""The published status under a flood (agent/published.py jobs_in_turns, bounded): a namespace whose starving jobs
sort first by name keeps no other team's starving job out of the document when it is cut to its size."""
from __future__ import annotations

from datetime import timedelta

from agent.planner.model import JobStatus, Plan
from agent.published import bounded, jobs_in_turns, published_document
from tests.builders import CONFIG, NOW


def job(namespace: str, name: str, *, starving: bool = True) -> JobStatus:
    return JobStatus(subject=f"{namespace}/Pod/{name}", owner=f"job-{namespace}-{name}", queue="default", priority=0,
                     min_member=1, bound=0, pending=1, starving=starving, reason="starving" if starving else "waiting")


def test_jobs_go_in_turns_across_namespaces_within_each_class() -> None:
    jobs = [job("aaa-flood", f"j{i:04}") for i in range(5)] + [job("team-b", "train"), job("team-c", "sim"),
                                                              job("aaa-flood", "idle", starving=False)]
    ordered = [j.subject for j in jobs_in_turns(jobs, {})]
    assert ordered[:4] == ["aaa-flood/Pod/j0000", "team-b/Pod/train", "team-c/Pod/sim", "aaa-flood/Pod/j0001"]
    assert ordered[-1] == "aaa-flood/Pod/idle", "not starving: after every starving job"
    locked = jobs_in_turns(jobs, {"job-team-c-sim": ["n1"]})
    assert locked[0].subject == "team-c/Pod/sim", "a locked job before any other"


def test_a_flood_of_starving_jobs_pushes_no_other_teams_job_out_of_the_document() -> None:
    flood = [job("aaa-flood", f"job-{i:05}") for i in range(20_000)]
    result = Plan(locks={}, jobs=tuple([*flood, job("team-b", "train")]))
    document = bounded(published_document(result, agent="a", planned=NOW + timedelta(0), config=CONFIG))
    assert document["omitted"].get("jobs"), "the flood must be cut for this test to say anything"
    assert "team-b/Pod/train" in {j["subject"] for j in document["jobs"]}
