"""The planner: pure functions from a snapshot, the config and `now` to the locks that should exist.

No I/O, no clock reads, no randomness. `plan.plan()` runs the registry `plan.POLICIES` (reservation > queue guarantee
> window > starvation, DESIGN 4) under one global cap: each policy (`policy.Policy`) reads one frozen
`policy.PlanContext` and returns one `policy.PolicyResult`; which locks already on the nodes a policy may take over is
one table, `displacement.DISPLACES`; the repairs follow from the plan (`repair.plan_repairs`).

Modules: `model` (plain data: snapshot, locks, statuses, Plan), `podindex` (the pods by node, job, uid and pending,
kept up to date from changes), `capacity` (idle now and over time), `jobs`, `ordering` (seed 001), `policy` (the
contract), `displacement` (the table), `reservations` (003), `guarantee` and `guarantee_search` (002), `windows`
(004), `starvation` (000), `repair`, `plan`.

Incremental planning (issue 34): a plan handed the previous one (`plan.plan(..., previous=)`) gives the same answer as
a plan from scratch, and only saves work: the snapshot's pod index (`podindex.PodIndex`, which the agent updates from
its pod cache's changes), the node states whose node and pods did not change (`capacity.node_states`), and what each
node state remembers per task shape while it lives (`capacity.NodeState.ranks`: starvation's node ranking and
placeable-now, backfill's clause 3). Between plans, the pods that arrive on the backfill gate are decided by a gate
pass (`plan.plan_gate`: the last plan's locks, the node states of now). The equivalence is tested against the full
recompute (tests/unit/test_podindex.py, tests/unit/test_gate_pass.py).

Where each seed's rules live, by the seed's own names (functions are `module.function`; webhook/ and agent/ outside
the planner are named in full):

Seed 000, "Reserve Action" (starvation.STARVATION):
- "Job Ready" -> jobs.Job.ready; "ReadyTaskNum" -> jobs.Job.bound; the job and its MinAvailable -> jobs.build_jobs
- "Job Condition Ready" (reserved tasks count) -> starvation.job_turn (kept locks), starvation.reserve_job
- "Job starving", isJobStarving -> starvation.is_starving; a pod held by `schedulingGates` is not pending ->
  jobs.Job.pending, jobs.build_jobs
- "Reserved" (a task reserved on a node) -> starvation.reserve_tasks, starvation.NodeChooser.choose
- "Node reserve logic" (allocatable >= request) -> starvation.NodeChooser._usable, capacity.time_to_fit; "resources
  will be `allocated`" when idle covers the task now (no lock) -> starvation.reserve_tasks (Reserved.fit_now)
- "Node selection strategy to participate in reserve", "PredicateNodes for task" -> starvation.NodeChooser,
  starvation.placeable_now; the predicate itself (kube-scheduler's, for every policy) -> shared/predicates.py
  schedulable_on
- "Node calculating score logic" ((cpu + memory) / 2 + 2 * scalar) / 3 -> capacity.idle_fraction
- "The proportion of nodes participating in reserve action" (reservedNodePercent) -> starvation.starvation_cap,
  starvation.Budget, starvation.plan_starvation
- "Reserve logic" (a higher-priority job that can be scheduled goes first) -> starvation.higher_priority_blocker
  (asked per job through starvation.Blockers)
- "Reserve will succeed only if the job can reach ready or condition ready" (minMember - bound tasks) ->
  starvation.reserve_job, starvation.needed_tasks
- "Data Model": `Reserved` is "the sum of the resource requirement of all the tasks reserved" -> starvation.job_locks
- maxLockDuration and cool-down (DESIGN 4.1, `lockCooldown`) -> starvation.release_expired, starvation.lock_cooldowns
  (the `reservoir.sh/lock-expired` node annotation, Plan.node_marks; written by agent/writer.py node_patch),
  starvation.back_of_the_order
- "Nodes who have reserved resources will no longer scheduler new non-BestEffort tasks" -> the lock (model.Lock);
  BestEffort exemption -> webhook/mutate.py exempt_from_locks; the task's toleration -> repair.owed_by_job_locks

Seed 001, "Priority For Queue":
- "Queue's Score Of Priority", "Of DRF", "Of Proportion", "Total Score" -> ordering.score, ordering.share,
  ordering.queue_priority, ordering.deserved
- "QueueScoreOrder" -> ordering.queue_scores, ordering.score_queues, plan.plan_context; guaranteed queues in that
  order -> guarantee.plan_guarantees; "by CreationTimestamp first, then by UID" -> ordering.queue_scores (exact)
- `QueueScoreOrderEnable` -> config `queueOrder.queueScoreOrderEnable`, ordering.tiered_key
- "the job priority will inherit the priority of queue", `cache.go` (the PodGroup's own class first) ->
  shared/priority.py job_class; webhook/mutate.py _inherit_priority; a job's priority -> jobs.job_class_value,
  jobs.Job.priority, shared/priority.py job_priority
- the "reflection" (jobs ordered by priority across queues, `ordering: job-first`) -> ordering.order_jobs

Seed 002, "Resource Reservation For Queue" (guarantee.GUARANTEES):
- `guarantee` {policy, percentage, resource} -> guarantee.guaranteed_queues (opted in: QueueView.locks_guarantee;
  the others: guarantee.not_opted_in), guarantee.guarantee_request, guarantee.resource_option,
  guarantee.percentage_option, guarantee.dimension_resource (`gpu`); the API -> webhook/validate.py validate_queue
- "math.Floor(clusterNodeNumber * percentage)" -> guarantee.percentage_option (exact: shared/views.py _fraction)
- "The request cannot be more than the total resource amount of cluster", "If `capability` is set, request must be
  no more than it" -> guarantee.refuse_oversize, webhook/validate.py validate_queue
- "choose the one with more reserved resources as the final result" -> guarantee.more_reserved
- "Nodes locked by target job cannot be chosen", "Nodes locked by another queue cannot be chosen" ->
  displacement.DISPLACES, guarantee.queue_seat
- "Algorithm", "Complete formula" (0.4 / 0.35 / 0.15 / 0.1) -> guarantee_search.Problem.score_of,
  guarantee_search.search, guarantee_search.brute_force; its search pool -> guarantee_search.best_of_each_shape,
  guarantee_search.shape_of (nodes grouped by coarse shape), guarantee_search.pool, guarantee.search_pool
- "Lock Strategy", "schedule relock" (no churn) -> guarantee.resource_option (KEEP_MARGIN)
- policy "Guaranteed" (evicting) -> guarantee.guaranteed_evictions; the evictions -> agent/writer.py
  Writer.write_queues, agent/writer.py eviction_body; its locks exclusive -> model.Lock.exclusive,
  agent/writer.py node_patch, shared/entitlement.py Entitlement (BestEffort exemption stops there)
- a queue's pods' tolerations -> repair.holding_queues, repair.owed_by_queue_locks
- NodeLocked / NodeReleased on the Queue (DESIGN 4 "Visibility") -> agent/writer.py owner_object
- `status.reservation` {nodes, resource} -> guarantee.guarantee_queue; written by agent/writer.py
  queue_status_patch, agent/writer.py Writer.write_queues
- "Safety" (a cap on locked nodes) -> policy.cap, plan.plan_context (maxLockedNodePercent)

Seed 003, "Resource Reservation" (reservations.RESERVATIONS):
- "Schedule Reservations" -> reservations.schedule_reservation, reservations.node_allowed, reservations.unschedulable
- "Allocate Reserved Resources", `spec.owners` -> reservations.is_owner, reservations.bound_owners,
  webhook/mutate.py entitled_owners, webhook/mutate.py required_reservations; owners' tolerations ->
  repair.holding_reservations
- `allocateOnce` -> reservations.reservation_turn
- "Expiration and Cleanup" (`ttl`, `expires`, node deleted, garbage collection) -> reservations.expiry,
  reservations.reservation_turn, reservations.stays_ended, reservations.Round.status (delete)
- "Usage in Pre-allocation" (`preAllocation`, phase Waiting) -> reservations.hold_node
- `status.phase`, `status.conditions` -> reservations.Round.status, reservations._condition; written by
  agent/writer.py reservation_status_patch, agent/writer.py Writer.write_reservations; the API ->
  webhook/validate.py validate_reservation

Seed 004, "node resource reservation" (windows.WINDOWS):
- "recognize pods which need to be reserved" (`volcano.sh/reserveable`) and "recognize pod max running time"
  (`volcano.sh/maximum-runtime`), from the pod or its podgroup -> reserve.is_reserve_pod, reserve.maximum_runtime
  (reserve.with_group_runtimes for the release curves), webhook/mutate.py copy_reserve_annotations,
  webhook/validate.py reserve_annotation_problems; the runtime's end -> capacity.pod_end
- `reservelabels` with `cron`, `startReserveAgo` -> windows.window_bounds
- "ReserveNodesMap": "order the nodes desc by node idle", "accumulate the node allocatable resource" ->
  windows.window_nodes, capacity.future_idle
- `podNumToReserve`, "reservedTaskAllocatedResource", "reservedTaskPendingResource" -> windows.window_released,
  windows.reserve_demand (on windows.counted_nodes; pending pods that could run on the window's nodes:
  windows.PendingFit); "max(reservedTaskAllocatedResource +
  reservedTaskPendingResource, reserveResourcesConfig)" -> windows.reserve_target
- "PredicateFn": "if the task is a reserve task, permit" -> the reserve pods' tolerations, repair.holding_windows

Across the seeds: precedence -> plan.POLICIES; displacement -> displacement.DISPLACES, displacement.may_take;
"a kept lock keeps its since" -> policy.kept_since; notes tagged `policy=<name>` -> policy.tagged.
"""
