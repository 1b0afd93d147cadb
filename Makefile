# Patchbay: `make help` lists every target. The README's quick start is `make demo` and `make test`.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

VENV        ?= .venv
PY          := $(VENV)/bin/python
# The Kubernetes release every target runs on: one of the support matrix (hack/kube-releases,
# oldest first); the newest by default. `make demo K8S_VERSION=v1.34.4`, `make test K8S_VERSION=...`.
K8S_MATRIX  := $(shell hack/kube-binaries.sh --matrix)
K8S_VERSION ?= $(lastword $(K8S_MATRIX))
K8S_OLDEST  := $(firstword $(K8S_MATRIX))
export K8S_VERSION
KUBE_BIN    := $(shell K8S_VERSION=$(K8S_VERSION) hack/kube-binaries.sh --print-bin-dir)
CLUSTER_DIR ?= $(HOME)/.local/state/patchbay/devcluster
NODES       ?= 10
PYTEST_ARGS ?=

# Every recipe finds the pinned Kubernetes binaries and the virtualenv's tools first.
export PATCHBAY_KUBE_BIN := $(KUBE_BIN)
export PATCHBAY_DEVCLUSTER_DIR := $(CLUSTER_DIR)
export PATH := $(KUBE_BIN):$(abspath $(VENV))/bin:$(PATH)

# The programs, each with its own pyproject.toml (its package and its dependencies).
# api/ is the package of the API the others share (patchbay_api); installed first.
PROGRAMS    := api operator plugin-agent devcluster kubectl-patchbay
PYPROJECTS  := pyproject.toml $(addsuffix /pyproject.toml,$(PROGRAMS))

# The virtualenv is reinstalled only when a pyproject.toml changes.
VENV_STAMP := $(VENV)/.installed-$(shell cat $(PYPROJECTS) | sha256sum | cut -c1-12)

##@ General

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} \
	  /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-22s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Setup

.PHONY: setup
setup: host-check host-packages venv kube-binaries ## Check the host, then install everything: Debian packages, the virtualenv, the pinned Kubernetes binaries (idempotent)

.PHONY: host-check
host-check: ## Stop at once, in one line, on a host the real node cannot run on (python3 < 3.11, not root, no usable cgroups)
	@command -v python3 >/dev/null || { echo "[host-check] no python3: apt-get install python3 python3-venv" >&2; exit 1; }
	@python3 hack/host_check.py

.PHONY: host-packages
host-packages: ## Debian packages for the real node (runc, CNI plugins, busybox-static, gcc, podman, python3-venv)
	@hack/host-packages.sh

.PHONY: venv
venv: $(VENV_STAMP) ## Create .venv and install the package with its dev tools

$(VENV_STAMP): $(PYPROJECTS)
	@echo "==> Python virtualenv $(VENV): the programs and their shared API package (editable) and the dev tools"
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@$(PY) -m pip install --quiet --progress-bar off $(addprefix -e ./,$(PROGRAMS)) -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

.PHONY: kube-binaries
kube-binaries: ## Build (or reuse from the cache) etcd, kube-*, kubelet, kubectl, kwok, helm for K8S_VERSION (an older host Go fetches the Go they need), the OCI registry and cosign
	@hack/kube-binaries.sh
	@hack/registry-binary.sh >/dev/null
	@hack/cosign-binary.sh >/dev/null

.PHONY: kube-binaries-matrix
kube-binaries-matrix: ## Build (or reuse) the Kubernetes binaries of every release of the matrix
	@for v in $(K8S_MATRIX); do K8S_VERSION=$$v hack/kube-binaries.sh; done

##@ Develop

.PHONY: lint
lint: venv ## ruff, mypy --strict and import-linter
	ruff check .
	ruff format --check .
	mypy
	lint-imports

.PHONY: fmt
fmt: venv ## Format and auto-fix
	ruff format .
	ruff check --fix .

.PHONY: generate
generate: venv ## Regenerate every generated file
	$(PY) hack/generate.py write

.PHONY: verify
verify: venv ## Fail when a generated file is stale
	$(PY) hack/generate.py check

##@ Test

.PHONY: test
test: setup lint verify ## The whole suite: lint, verify, unit and integration tests on a real local control plane
	@$(PY) hack/demo.py make-room
	$(PY) -m pytest $(PYTEST_ARGS)

.PHONY: test-unit
test-unit: venv ## Unit tests only: pure code, no process of a cluster (marker: not cluster)
	$(PY) -m pytest tests/unit -m "not cluster and not node and not peer" $(PYTEST_ARGS)

.PHONY: test-agent
test-agent: venv ## The agent: unit tests, then on real Unix sockets with a Python kubelet peer (no cluster)
	$(PY) -m pytest tests/unit/agent tests/sockets tests/fuzz $(PYTEST_ARGS)

.PHONY: test-fuzz
test-fuzz: venv ## Bad input, tried: the agent's HTTP, device plugin and DRA services, its config files
	$(PY) -m pytest tests/fuzz $(PYTEST_ARGS)

.PHONY: record-gitops-health
record-gitops-health: setup ## Record the Argo CD health check's test statuses (examples/gitops/argocd) from a run on the real node
	@$(PY) hack/demo.py make-room
	PATCHBAY_RECORD_GITOPS=$(abspath examples/gitops/argocd/resource_customizations/patchbay.dev/DevicePluginProfile) \
	  $(PY) -m pytest tests/e2e/test_gitops_health_on_real_node.py $(PYTEST_ARGS)

.PHONY: test-release
test-release: setup ## e2e + integration on K8S_VERSION only (what the matrix runs per release)
	@# Not the release_independent modules (no Kubernetes component: they ran with the newest).
	@# Integration first, as in the whole suite: the e2e cluster's real node lives until the session
	@# ends, and the integration tests that start a real node of their own wait for the machine's.
	@$(PY) hack/demo.py make-room
	$(PY) -m pytest tests/integration tests/e2e -m "not release_independent" $(PYTEST_ARGS)

.PHONY: test-oldest
test-oldest: ## e2e + integration on the oldest release of the matrix (CI runs it after `make test`)
	@$(MAKE) K8S_VERSION=$(K8S_OLDEST) test-release

.PHONY: test-matrix
test-matrix: ## e2e + integration on every release of the matrix, oldest first; a summary at the end
	@failed=""; for v in $(K8S_MATRIX); do \
	  echo "==> $$v: e2e + integration"; \
	  $(MAKE) K8S_VERSION=$$v test-release || failed="$$failed $$v"; \
	done; \
	if [ -n "$$failed" ]; then echo "test-matrix FAILED on:$$failed"; exit 1; fi; \
	echo "test-matrix passed on: $(K8S_MATRIX)"

.PHONY: test-conformance
test-conformance: setup ## The agent against the upstream kubelet device manager (Go peer, newest release)
	$(PY) -m pytest tests/conformance $(PYTEST_ARGS)

.PHONY: test-e2e
test-e2e: setup ## End to end on the real node (kubelet + containerd + runc; root)
	@$(PY) hack/demo.py make-room
	$(PY) -m pytest tests/e2e $(PYTEST_ARGS)

.PHONY: test-integration
test-integration: setup ## Integration tests against a real control plane started for the session
	@$(PY) hack/demo.py make-room
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

##@ Benchmarks (figures only; see docs/benchmarks.md)

# The harness is bench/patchbay_bench; it reuses the test suites' peers (tests/support).
BENCH       := PYTHONPATH=$(CURDIR)/bench:$(CURDIR)/tests $(PY) -m patchbay_bench
SCENARIO    ?=
BENCH_ARGS  ?=

.PHONY: bench
bench: $(if $(SCENARIO),setup,venv) ## List the scenarios; SCENARIO=<name>[,<name>...]|all runs them full size (BENCH_ARGS="key=value ...")
	@if [ -z "$(SCENARIO)" ]; then $(BENCH) list; else $(BENCH) run $(SCENARIO) $(BENCH_ARGS); fi

.PHONY: bench-quick
bench-quick: setup ## Every scenario at a small size, checking each records its figures (never their values); CI runs it
	$(BENCH) quick

.PHONY: bench-table
bench-table: venv ## The headline table's rows (docs/benchmarks.md), from the newest full records in docs/benchmarks/records/
	@$(BENCH) table

.PHONY: bench-plots
bench-plots: venv ## Redraw docs/img/ from the figures docs/benchmarks.md records
	$(BENCH) plots

##@ Images

# The images' platforms (`make images`, `make release`): linux/amd64, this machine's, is what the
# demo and the tests run; linux/arm64 is built under qemu-user emulation (hack/arm64-emulation.sh).
PLATFORMS   ?= linux/amd64,linux/arm64
comma       := ,
ARCHES      := $(patsubst linux/%,%,$(subst $(comma), ,$(PLATFORMS)))

.PHONY: images
images: setup ## Build the operator and agent images for PLATFORMS (podman, local Debian base per architecture; cached by content hash)
	@$(if $(filter-out amd64,$(ARCHES)),hack/arm64-emulation.sh)
	@for arch in $(ARCHES); do patchbay-devcluster images --arch $$arch; done

.PHONY: images-arm64
images-arm64: venv ## Only the linux/arm64 images (qemu-user emulation; what CI builds in the background)
	@hack/arm64-emulation.sh
	patchbay-devcluster images --arch arm64

.PHONY: test-arm64
test-arm64: images-arm64 ## The arm64 agent image's program under emulation against the Python kubelet peer, and the multi-arch push
	$(PY) -m pytest tests/emulated $(PYTEST_ARGS)

##@ Release

.PHONY: release
release: setup ## dist/<VERSION>/: the packaged chart, the images (PLATFORMS, one image index each) as OCI archives, their SBOMs, SHA256SUMS (docs/install.md); REGISTRY=host/path also pushes them there, signed with COSIGN_KEY (UNSIGNED=1: not)
	@$(if $(filter-out amd64,$(ARCHES)),hack/arm64-emulation.sh)
	$(PY) hack/release.py --platforms $(PLATFORMS) $(if $(REGISTRY),--registry $(REGISTRY)) $(if $(REGISTRY_CA),--ca-file $(REGISTRY_CA)) $(if $(COSIGN_KEY),--cosign-key $(COSIGN_KEY)) $(if $(UNSIGNED),--unsigned)

##@ Local cluster

.PHONY: cluster-up
cluster-up: setup ## Start the local cluster with NODES kwok nodes (default 10); REAL_NODE=1 adds a real kubelet
	patchbay-devcluster up --nodes $(NODES) $(if $(REAL_NODE),--real-node)

.PHONY: cluster-down
cluster-down: ## Stop every process of the local cluster and remove its state
	@if [ -x $(VENV)/bin/patchbay-devcluster ]; then patchbay-devcluster down; else echo "nothing to stop"; fi

.PHONY: cluster-kubeconfig
cluster-kubeconfig: ## Print the local cluster's kubeconfig path (last line)
	@patchbay-devcluster kubeconfig

.PHONY: cluster-status
cluster-status: ## Show the local cluster's processes, ports and health
	@patchbay-devcluster status

##@ Demo

.PHONY: demo
demo: setup ## Local cluster (real node + kwok), the operator, example profiles, pods using them, a summary
	$(PY) hack/demo.py

.PHONY: demo-down
demo-down: ## Stop everything the demo started (operator, agent, cluster)
	@if [ -x $(PY) ]; then $(PY) hack/demo.py down; else echo "nothing to stop"; fi
