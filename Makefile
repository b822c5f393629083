# raftmq: the two commands are `make demo` and `make test`. Everything else is a step of those.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RMQ5_DIR := build/rmq5
RMQ5_STAMP := $(RMQ5_DIR)/.installed
RMQ5_PINS := protos/rmq5_deps.py protos/generate.py $(wildcard protos/rmq5/*)
ONS_DIR := build/ons
ONS_STAMP := $(ONS_DIR)/.installed
ONS_PINS := protos/ons_deps.py protos/rmq5_deps.py $(wildcard protos/ons/*)
PACKAGES := mqerrors remoting mqrelease mqcli mqsecurity mqmetrics prockit rpckit dledger msgcodec broker mqcluster nameserver client jepsen_like spark_audit mqdashboard bench

.PHONY: venv system-deps gen gen-check lint typecheck test test-setup test-fast demo bench bench-smoke bench-peers bench-store bench-broker bench-audit bench-steps bench-compare bench-backlog clean

venv: $(STAMP) $(RMQ5_STAMP) $(ONS_STAMP)

# Reinstalled whenever pyproject.toml changes. Needs only Python 3.11 and the package index.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "raftmq needs Python >= 3.11"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,audit,bench]'
	touch $(STAMP)

# RocketMQ 5 (docs/RMQ5.md): the pinned npm package rocketmq-client-nodejs (its apache.rocketmq.v2
# protos and the Node.js client, integrity-checked by npm ci), the server stubs generated from
# those protos, and the official Python client in a venv of its own, all in build/rmq5 (ignored).
# Needs node 20/npm and the registries; fails loudly when a download or a hash check fails.
$(RMQ5_STAMP): $(STAMP) $(RMQ5_PINS)
	$(PY) protos/rmq5_deps.py --out $(RMQ5_DIR)
	touch $(RMQ5_STAMP)

# RocketMQ 4.x (docs/REMOTING.md): the pinned npm package ali-ons, a remoting-protocol client the
# broker's remoting tests drive unmodified, npm ci'd (integrity-checked) into build/ons (ignored).
$(ONS_STAMP): $(STAMP) $(ONS_PINS)
	$(PY) protos/ons_deps.py --out $(ONS_DIR)
	touch $(ONS_STAMP)

# System tools some tests need beyond Python, as command:Debian-package pairs: `iptables` for
# mqjepsen's network-namespace backend (tests/jepsen/test_netns.py); `chromium` and
# `chromedriver` (package chromium-driver) for the dashboard's browser test
# (tests/integration/test_dashboard_browser.py); `promtool` and `prometheus` (package
# prometheus) for the alert rules and the Grafana dashboard (tests/unit/test_prometheus_rules.py)
# and a real Prometheus scraping a group (tests/integration/test_prometheus_alerts.py).
# Installed with apt-get (after apt-get update) when missing and running as root (CI: a fresh
# Debian machine); a no-op costing one `command -v` per tool when present. Not root, or no
# apt-get: one note, no failure, and the tests that need them are skipped with the reason.
SYSTEM_TOOLS := iptables:iptables chromium:chromium chromedriver:chromium-driver promtool:prometheus prometheus:prometheus
system-deps:
	@missing=""; for pair in $(SYSTEM_TOOLS); do \
	  tool=$${pair%%:*}; package=$${pair#*:}; \
	  PATH="$$PATH:/usr/sbin:/sbin" command -v $$tool >/dev/null 2>&1 || missing="$$missing $$package"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "note: missing$$missing and not root: the tests that need it are skipped (as root: apt-get install -y$$missing)"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	  echo "note: missing$$missing and no apt-get: the tests that need it are skipped"; \
	else \
	  echo "installing$$missing (apt-get)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends$$missing >/dev/null; \
	fi

# Regenerate the committed gRPC stubs in gen/ from protos/, what derives from the error
# table (mqerrors/codes.py, the table of docs/ERRORS.md), and the broker.conf key table of
# docs/CONFIG.md (from broker/config.py's KEYS).
gen: venv
	$(PY) protos/generate.py
	$(PY) -m mqerrors.generate
	$(PY) -m broker.configdocs

# Generate the stubs into a temporary dir and fail if the committed ones differ; fail if the
# error table's constants module or docs section (python -m mqerrors.generate) is stale, or
# when docs/CONFIG.md's key table (python -m broker.configdocs) is.
# (gen-check, lint and typecheck need the project's venv, not build/rmq5: they depend on the
# stamp only, so that `make test` runs them while the RocketMQ 5 packages download.)
gen-check: $(STAMP)
	$(PY) protos/generate.py --check
	$(PY) -m mqerrors.generate --check
	$(PY) -m broker.configdocs --check

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: $(STAMP)
	$(PY) -m mypy $(PACKAGES) protos/generate.py protos/rmq5_deps.py protos/ons_deps.py setup.py

# make test's steps before pytest, run side by side (the sub-make's -j): apt-get (system-deps,
# about 2 minutes on a fresh CI box) waits on the network and dpkg while pip, npm and the checks
# run; each step's output is printed whole when it ends (-Otarget); any failure stops make test.
TEST_SETUP_JOBS := 4
test-setup: venv system-deps gen-check lint typecheck

# pytest as two sessions side by side, on the 2 cores that one session leaves half idle (its
# integration tests mostly wait on their groups): `-m processes` (every test that starts
# processes, tests/conftest.py; one at a time, in file order) reports live, but for SIDE_TESTS,
# which run after `-m "not processes"` (unit, simulator, checker tests) in the second session,
# so that both sessions take about as long (measured 2026-11-28 on a loaded machine: the first
# ~14 min, the second ~12): the tests that audit with Spark (tests/audit, the fuzz suite and
# the rolling upgrade from the previous release: they share one SparkSession), and the longest
# runs of whole groups (mqjepsen's short runs, the network-namespace hosts, the bench smoke, the
# wheel built and run from a clean venv: 30-50 s on a quiet machine, 2-4 min on a loaded one,
# two builds and two venvs from the network; the two network-namespace tests run one after the
# other in that session), and two storage-repair files (members restarted until they vote
# again: moved 2026-11-29, when the first session took 17 min against the second's 13). Its report goes into a file printed after the first's. The two draw
# the ports they give their groups from ranges of their own (RAFTMQ_PICK_PORTS,
# prockit/processes.py), so they never pick the same one. Any of the three failing fails make
# test; the last line before the second report gives the codes.
PROCESS_PORTS := 20000-26384
SECOND_PORTS := 26384-32768
SIDE_TESTS := tests/audit tests/integration/test_fuzz_services.py tests/jepsen \
  tests/integration/test_multihost_netns.py tests/integration/test_bench_smoke.py \
  tests/integration/test_upgrade.py tests/integration/test_wheel_install.py \
  tests/integration/test_storage_membership.py tests/integration/test_storage_no_good_copy.py
test:
	@$(MAKE) --no-print-directory -j$(TEST_SETUP_JOBS) -Otarget test-setup
	@others=$$(mktemp /tmp/raftmq-test-others-XXXXXX); \
	( export RAFTMQ_PICK_PORTS=$(SECOND_PORTS); \
	  $(PY) -m pytest -m "not processes"; b=$$?; \
	  $(PY) -m pytest -m processes $(SIDE_TESTS); c=$$?; \
	  echo "pytest -m 'not processes' exited $$b, pytest -m processes $(SIDE_TESTS) exited $$c"; \
	  [ $$b -eq 0 ] && [ $$c -eq 0 ] ) >$$others 2>&1 & bg=$$!; \
	trap 'kill $$bg 2>/dev/null' INT TERM; \
	echo "pytest -m processes, but for $(SIDE_TESTS) (pytest -m 'not processes', then those, run beside it; their report follows)"; \
	RAFTMQ_PICK_PORTS=$(PROCESS_PORTS) $(PY) -m pytest -m processes $(SIDE_TESTS:%=--ignore=%); a=$$?; \
	wait $$bg; b=$$?; \
	echo "make test: pytest -m processes exited $$a, the second session (not processes, then SIDE_TESTS) exited $$b"; \
	echo "== pytest -m 'not processes', then pytest -m processes $(SIDE_TESTS)"; cat $$others; rm -f $$others; \
	[ $$a -eq 0 ] && [ $$b -eq 0 ]

# The edit loop: unit tests and the simulator only.
test-fast: venv
	$(PY) -m pytest tests/unit tests/sim -q

# The main job: the log store on its own, then a local 3-node group over gRPC with a leader
# failover, checked replica by replica, then a Spark audit of the replicas' files; everything
# is torn down at the end.
demo: venv
	$(PY) -m dledger.storage.demo
	@dir=$$(mktemp -d /tmp/raftmq-demo-XXXXXX); \
	$(PY) -m mqcluster.demo --base-dir $$dir && \
	echo "== auditing the 3 replicas' log stores with Spark (mqaudit, docs/AUDIT.md)" && \
	$(PY) -m spark_audit $$dir/group; \
	rc=$$?; rm -rf $$dir; exit $$rc

bench-store: venv
	$(PY) -m bench.store

bench-broker: venv
	$(PY) -m bench.broker

# Spark audit throughput over 3 replicas x 1 GiB (needs about 6.5 GB free in /tmp).
bench-audit: venv
	$(PY) -m bench.audit

# The benchmark of issue #10 (mqbench): a 3-node group under both flush modes, side by side with
# etcd and NATS JetStream when installed (make bench-peers); results in bench/results/.
bench: venv
	$(PY) -m bench
	$(PY) -m bench.steps

# Steps per message on each node (issue 36: calls, system calls, loop wake-ups, copies of a
# body); bench/results/steps-<UTC>.md. COMPARE=<another checkout> alternates its brokers with ours.
bench-steps: venv
	$(PY) -m bench.steps $(if $(COMPARE),--compare $(COMPARE) --rounds 2)

# A deep backlog (issue 36): a 3-node group filled with MESSAGES (default 1,000,000) x 128 B in
# steps, RssAnon per node and the send rate at each step, a node's and the group's restart, the
# catch-up read; bench/results/backlog-<UTC>.md, .json and .svg. Bounded: 10 GB of disk, 10
# minutes of fill (python -m bench.backlog --help).
bench-backlog: venv
	$(PY) -m bench.backlog $(if $(MESSAGES),--messages $(MESSAGES))

# The produce path of this checkout against another's, same run, rounds alternating (issue
# #33's before/after): make bench-compare BEFORE=<checkout>; bench/results/compare-<UTC>.md.
bench-compare: venv
	$(PY) -m bench.compare --before $(BEFORE)

# etcd-server and nats-server from Debian: the peers mqbench compares with (root, or sudo).
bench-peers: venv
	$(PY) -m bench.peers install

# Every part of mqbench once, small: checks the harness end to end (also run by make test).
bench-smoke: venv
	$(PY) -m bench --smoke

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
