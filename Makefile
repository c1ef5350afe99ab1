# Reservoir's two set-up commands: `make up` runs it on a local cluster, `make test` runs the whole suite.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: up test lint docs unit e2e e2e-oldest cluster-bin bench-webhook bench-planner bench-planner-compare bench-scale bench-simulate bench-seeds clean

# What we test and ship is pinned with hashes: requirements-test.lock (the product, the test tools and the build
# backend) here, requirements.lock (the product) in the image. The project itself goes in without its dependencies
# and without build isolation, so nothing is fetched that the lock does not name.
TEST_LOCK := requirements-test.lock
PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check
$(STAMP): pyproject.toml $(TEST_LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --require-hashes --requirement $(TEST_LOCK)
	$(PIP_INSTALL) --no-deps --no-build-isolation --editable .
	@touch $(STAMP)

## lock: pin every Python dependency again, with hashes, into requirements.lock (the product and the build backend:
## the image) and requirements-test.lock (those, the test tools and the benchmarks' matplotlib, at the same versions:
## make test, make up, the benchmarks, CI).
## Run it after changing a dependency in pyproject.toml (make test fails until you do); pins that still satisfy
## pyproject.toml are kept, UPGRADE=1 takes the newest releases instead. Then run make test and commit both files.
LOCK_FLAGS = --quiet --generate-hashes --universal --python-version 3.11 --custom-compile-command 'make lock' \
  $(if $(UPGRADE),--upgrade)
BUILD_REQUIRES = $(PY) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")'
.PHONY: lock
lock: $(STAMP)
	$(BUILD_REQUIRES) | $(VENV)/bin/uv pip compile $(LOCK_FLAGS) pyproject.toml - --output-file requirements.lock
	$(BUILD_REQUIRES) | $(VENV)/bin/uv pip compile $(LOCK_FLAGS) pyproject.toml - --extra test --extra bench --extra docs \
	  --constraint requirements.lock --output-file $(TEST_LOCK)

## cluster-bin: build etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, kwok, helm and promtool (cached)
cluster-bin:
	@./localcluster/build.sh >/dev/null

## test: the whole suite (layers, types and lint; the docs site built --strict; unit, webhook over HTTPS, end to end on
## a local control plane)
test: lint docs $(STAMP) cluster-bin
	$(PY) -m pytest -q

## lint: the import contracts (pyproject [tool.importlinter]), mypy --strict and ruff on the product packages
PRODUCT := reservoir agent webhook certs shared
lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(VENV)/bin/ruff check $(PRODUCT)

## docs: the documentation site (mkdocs.yml, docs/) built into site/ with --strict: a broken link or anchor, a page
## missing from the nav or a configuration field without a description fails; its reference pages are generated
## from the code (reservoir/reference.py). Browse it with `.venv/bin/mkdocs serve`.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

e2e: $(STAMP) cluster-bin
	$(PY) -m pytest -q tests/e2e

## e2e-oldest: the whole end-to-end suite against the oldest Kubernetes minor Reservoir supports (versions.env
## KUBERNETES_OLDEST_VERSION, docs/development.md), its binaries built the same way and cached apart
e2e-oldest: $(STAMP)
	@RESERVOIR_KUBERNETES=oldest ./localcluster/build.sh >/dev/null
	RESERVOIR_KUBERNETES=oldest $(PY) -m pytest -q tests/e2e

## up: run Reservoir for real on a local cluster (Ctrl-C stops everything it started); KUEUE=1: with Kueue's manager
up: $(STAMP) cluster-bin
	$(PY) -m localcluster up $(if $(KUEUE),--kueue)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

LOADGEN := $(HOME)/.cache/reservoir/bin/loadgen
$(LOADGEN): bench/webhook/loadgen/main.go bench/webhook/loadgen/go.mod
	@mkdir -p $(dir $(LOADGEN))
	cd bench/webhook/loadgen && go build -o $(LOADGEN) .

## bench-webhook: mutate route vs no-op route on the same server, side by side (about a minute)
bench-webhook: $(STAMP) $(LOADGEN)
	$(PY) -m bench.webhook.run $(LOADGEN)

## bench-planner: one full plan at 500, 5,000 and 10,000 nodes (30 pods per node, 1% pending), side by side; the
## guarantee search against brute force; 100 guaranteed queues on them and on a heterogeneous cluster of 500 and
## 5,000 nodes; last line `planner: 5000 mixed nodes, 100 guarantees: plan S s, peak M MiB` (tracemalloc peak)
bench-planner: $(STAMP)
	$(PY) -m bench.planner.run

## bench-planner-compare: the planner benchmark of BASE (a git rev, default HEAD) and of TREE (a git rev, default the
## working tree), side by side in one run
bench-planner-compare: $(STAMP)
	$(PY) -m bench.planner.compare $(or $(BASE),HEAD) $(TREE)

## bench-scale: Reservoir on the local control plane with NODES kwok nodes (default 1,000) and 30 pre-bound pods each:
## long-running and freshly started agent RSS, cache-sync time, idle cpu over 60 s, threshold-to-taint, 4 locks
## released at once; last line `scale: N nodes P pods: fresh agent peak F MiB (steady S MiB), sync T s, idle cpu C%,
## lock L s after threshold` (about 14 minutes at 1,000 nodes)
bench-scale: $(STAMP) cluster-bin
	$(PY) -m bench.scale.run $(if $(NODES),--nodes $(NODES)) $(if $(STATUS_BASE),--status-base $(STATUS_BASE))

.PHONY: bench-backfill
## bench-backfill: seed 000's starvation locks on 200 kwok nodes with a stream of short pods, backfill off and then on,
## side by side; last line `backfill: locked idle cpu-s OFF -> ON (-X%), owner delay +D s, backfilled B pods` (about
## 5 minutes)
bench-backfill: $(STAMP) cluster-bin
	$(PY) -m bench.backfill.run

.PHONY: bench-gate
## bench-gate: the backfill gate's delay under a stream of RATE (default 50) pods a second that opt in, for DURATION
## (default 60), on 100 kwok nodes with 4 starvation locks; last line `gate: R pods/s for S s, H held: delay p50 X s,
## p95 Y s, max Z s (...)` (about 5 minutes)
bench-gate: $(STAMP) cluster-bin
	$(PY) -m bench.gate.run $(if $(RATE),--rate $(RATE)) $(if $(DURATION),--seconds $(DURATION))

.PHONY: bench-handover
## bench-handover: seed 003's handover lock against kube-scheduler's nominatedNodeName (KEP-5278) on the local control
## plane, strangers of lower, equal and higher priority; last line `handover: lock W/W/W of N owners (lower/equal/higher
## strangers), nominated W/W/W of N owners (...)` (about 3 minutes)
bench-handover: $(STAMP) cluster-bin
	$(PY) -m bench.handover.run $(if $(ROUNDS),--rounds $(ROUNDS))

.PHONY: fuzz-webhook
## fuzz-webhook: 10,000 hostile AdmissionReviews against the real HTTPS server (SEED=, COUNT= to change them); last line
## `fuzz: N requests, 5xx E, slowest S ms`, E must be 0 and S under 100 (about 20 s)
fuzz-webhook: $(STAMP)
	$(PY) -m bench.fuzz.webhook $(if $(SEED),--seed $(SEED)) $(if $(COUNT),--count $(COUNT))

.PHONY: image
## image: the container image (Containerfile), built with podman, else docker, and tagged as deploy/kustomization.yaml
## names it (its `images:` entry, the one place); BASE= another Python 3.11 base image (default python:3.11-slim;
## a machine that cannot pull it: `image/base.sh` then `make image BASE=localhost/reservoir-base`)
VERSION = $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_NAME = $(shell sed -n 's/^  newName: *//p' deploy/kustomization.yaml)
IMAGE_TAG = $(shell sed -n 's/^  newTag: *//p' deploy/kustomization.yaml)
IMAGE ?= $(IMAGE_NAME):$(IMAGE_TAG)
CONTAINER_TOOL ?= $(shell command -v podman 2>/dev/null || command -v docker 2>/dev/null)
image:
	@test -n "$(CONTAINER_TOOL)" || { echo "make image: neither podman nor docker is installed" >&2; exit 1; }
	@test "$(IMAGE_TAG)" = "$(VERSION)" || { echo "make image: deploy/kustomization.yaml tags the image \
	$(IMAGE_TAG), pyproject.toml's version is $(VERSION): make them agree" >&2; exit 1; }
	$(CONTAINER_TOOL) build --network=host --file Containerfile --tag $(IMAGE) --build-arg VERSION=$(VERSION) \
	  --build-arg REVISION=$(shell git rev-parse --short HEAD 2>/dev/null || echo unknown) \
	  $(if $(BASE),--build-arg BASE=$(BASE)) .

.PHONY: bench-simulate
## bench-simulate: reservoir simulate at scale: 100,000 pods of the synthetic trace on 5,000 nodes of its shapes
## (NODES=, PODS=), each arm in turn on one core, in a process of its own; CPU seconds per arm and the largest arm's
## peak RSS; last line
## `simulate: N pods on M nodes: alone C s, starvation C s, backfill C s of CPU; peak RSS R MiB`
bench-simulate: $(STAMP)
	$(PY) -m bench.trace.simulate_scale $(if $(NODES),--nodes $(NODES)) $(if $(PODS),--pods $(PODS))

.PHONY: bench-seeds
## bench-seeds: bench-trace's goals over SEEDS= draws of the synthetic trace (12) in the model (reservoir simulate),
## with the backfill arm also run without softDrain beside it; a line per draw, the draws each goal holds on; last line
## `seeds: N draws: 8gpu x3 met in A (B without softDrain; reachable without eviction in F), every goal in C` (about 2 minutes)
bench-seeds: $(STAMP)
	$(PY) -m bench.trace.seeds $(if $(SEEDS),--seeds $(SEEDS))

.PHONY: bench-trace
## bench-trace: a production GPU cluster's pods (Alibaba's openb trace format; default a synthetic trace drawn from its
## figures) replayed through the real API server, webhook and kube-scheduler on kwok nodes of its shapes: kube-scheduler
## alone, Reservoir's starvation locks, and with backfill, side by side. TRACE= and NODES= the trace's pods and nodes
## CSVs, FRACTION= of each node shape (0.1), WINDOW= seconds of arrivals (300); report, JSON and PNGs in
## .reservoir/bench-trace; last line `trace: 8gpu p95 A s -> B s (xR), 1gpu p95 C s -> D s, gpu alloc E -> F,
## backfilled N, unplaced U` (about 25 minutes)
bench-trace: $(STAMP) cluster-bin
	$(PY) -m bench.trace.run $(if $(TRACE),--pods $(TRACE)) $(if $(NODES),--nodes $(NODES)) \
	  $(if $(FRACTION),--fraction $(FRACTION)) $(if $(WINDOW),--window $(WINDOW))
