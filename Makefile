# workload-ca build, test and demo. Everything it needs comes from the Go
# module proxy, pinned in go.mod, tools/go.mod, tools/sbom/go.mod,
# e2e/tools/go.mod, e2e/kmstools/go.mod, e2e/istiotools/go.mod and
# e2e/spiretools/go.mod.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := build

# Every build (the product, the image, the tools, the e2e dependencies and
# whatever the tests build) uses this Go: machines start on their own Go and
# ignore go.mod's toolchain line, so it is set here and exported. The go
# command fetches it from the module proxy once.
export GOTOOLCHAIN := go1.27.3
GO      ?= go
BIN     := $(CURDIR)/bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
COMMIT_TIME ?= $(shell git log -1 --format=%cI 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.revision=$(REVISION) -X main.commitTime=$(COMMIT_TIME)

# What the tests run but never change (the control plane, istiod, Vault,
# cert-manager, SPIRE, the linters and the vulnerability database) is built
# once per version (and srckey or modkey below) into a cache outside the
# clone, shared by every clone on the machine and kept by make clean.
# CACHE_DIR moves it.
CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/workload-ca
# modkey names a build of a tool module's binaries: its go.mod and go.sum,
# and the Go that builds them. srckey names a build of an e2e dependency:
# every Go file, go.mod and go.sum of its module (some hold code of ours).
modkey = $(shell cat $(1)/go.mod $(1)/go.sum | { cat; echo $(GOTOOLCHAIN); } | sha256sum | cut -c1-16)
srckey = $(shell cd $(1) && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print0 | sort -z | xargs -0 cat | sha256sum | cut -c1-12)
# cache-build DIR, CMD: runs CMD (which writes into $$tmp, a directory of its
# own) at low priority, then moves what it wrote into DIR. It holds DIR's
# lock while it builds and builds nothing if the target appeared meanwhile
# (another lane or clone built it), so a build cut short, or two at once,
# never leave half a binary or build one twice.
cache-build = renice -n 10 -p $$$$ >/dev/null && mkdir -p $(1) && exec 9>$(patsubst %/,%,$(1)).lock && flock 9 && \
	if [[ ! -e $@ ]]; then \
	tmp=$$(mktemp -d $(patsubst %/,%,$(1)).tmp.XXXXXX) && trap 'rm -rf "$$tmp"' EXIT && \
	( $(2) ) && shopt -s nullglob && for f in "$$tmp"/*; do \
		if [[ -d $$f ]]; then rm -rf "$(1)/$${f\#\#*/}"; fi; mv -f "$$f" $(1)/; done; fi
# link-tool: bin/NAME links to the cached tool this tree's key names (FORCE:
# checked every time, as the target's time is that of whatever it links to).
link-tool = mkdir -p $(BIN) && { [[ "$$(readlink $@)" == $< ]] || ln -sfn $< $@; }
.PHONY: FORCE
FORCE:
# Binaries that are only run, never debugged, nor shipped: no file paths of
# this machine, no debug information (the compiler writes none either, which
# is work saved on a cold build).
RUN_ONLY := -trimpath -gcflags=all=-dwarf=false
RUN_ONLY_LDFLAGS := -s -w

# The real control plane the e2e suite and the demo run against, built from
# pinned modules (e2e/tools/go.mod) and cached by version.
K8S_VERSION  := $(shell awk '$$1 == "k8s.io/kubernetes" {print $$2}' e2e/tools/go.mod)
ETCD_VERSION := $(shell awk '$$1 == "go.etcd.io/etcd/server/v3" {print $$2}' e2e/tools/go.mod)
CP_DIR       := $(CACHE_DIR)/controlplane-$(K8S_VERSION)-etcd-$(ETCD_VERSION)-$(call srckey,e2e/tools)
# istiod (pilot-discovery) for the e2e suite's Istio tests, from the
# istio.io/istio module e2e/istiotools/go.mod pins, cached by version.
ISTIO_VERSION := $(shell awk '$$1 == "istio.io/istio" {print $$2} $$1 == "require" && $$2 == "istio.io/istio" {print $$3}' e2e/istiotools/go.mod)
ISTIOD       := $(CACHE_DIR)/istiod-$(ISTIO_VERSION)-$(call srckey,e2e/istiotools)/pilot-discovery
# Vault, the upstream CA of the e2e suite's upstream tests and of the bench:
# its server core with the PKI engine and Kubernetes auth
# (e2e/vaulttools/vaultserver), from the module e2e/vaulttools/go.mod pins,
# cached by version.
VAULT_VERSION := $(shell awk '$$1 == "github.com/hashicorp/vault" {print $$2}' e2e/vaulttools/go.mod)
VAULT        := $(CACHE_DIR)/vault-$(VAULT_VERSION)-$(call srckey,e2e/vaulttools)/vault-server
# cert-manager's controllers (its approver, Issuer and CA signer), the
# other upstream CA of those tests, from e2e/certmanagertools, with its CRDs.
CERT_MANAGER_VERSION := $(shell awk '$$1 == "github.com/cert-manager/cert-manager" {print $$2}' e2e/certmanagertools/go.mod)
CERT_MANAGER := $(CACHE_DIR)/cert-manager-$(CERT_MANAGER_VERSION)-$(call srckey,e2e/certmanagertools)/cm-controller
# SPIRE's server, the federation peer of the e2e suite's SPIRE test, from the
# module e2e/spiretools/go.mod pins (a tool of that module), cached by
# version.
SPIRE_VERSION := $(shell awk '$$1 == "github.com/spiffe/spire" {print $$2}' e2e/spiretools/go.mod)
SPIRE        := $(CACHE_DIR)/spire-$(SPIRE_VERSION)-$(call srckey,e2e/spiretools)/spire-server
K8S_LDFLAGS  := -X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
	-X k8s.io/component-base/version.gitMajor=$(word 1,$(subst ., ,$(K8S_VERSION:v%=%))) \
	-X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(K8S_VERSION:v%=%))) \
	-X k8s.io/component-base/version.gitTreeState=clean

# Scratch space for tests (control-plane data, sockets) inside the work tree.
WORK := $(CURDIR)/.work

UNIT_PKGS = $$($(GO) list ./... | grep -v '/e2e')
# Outside e2e/, packages keep their real-apiserver tests (named TestE2E*,
# skipped without a control plane) beside their unit tests: every package
# whose tests import e2e/controlplane. make e2e runs only those tests there;
# make unit has run the rest.
E2E_PKGS  = $$(grep -rl --include='*_test.go' --exclude-dir=.work 'e2e/controlplane"' . | grep -v '^./e2e/' | xargs -r -n1 dirname | sort -u)

.PHONY: check lint-code e2e-deps os-packages sqlite-dev tidy-check config-reference config-reference-check vuln fuzz-smoke build test unit e2e lint generate generate-check tools controlplane demo fuzz bench bench-scale clean prometheus-tools hsm-tools chart-lint image istiod vault cert-manager spire

# Built with go vet's flags, so that after make lint it only links. The
# image's binaries are the release ones: -trimpath, static.
build: ## Build bin/workload-ca.
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/workload-ca ./cmd/workload-ca

# The container image, built without a container engine (deploy/image):
# static binaries (no cgo, so no PKCS#11) for IMAGE_PLATFORMS in one OCI
# image index, written as an OCI layout (bin/image) and, for this machine's
# platform, as a tarball for docker/podman load, named $(HUB)/workload-ca:$(TAG)
# as Istio's builds are (default: the reference the chart installs); a
# CycloneDX SBOM of each platform's binary beside it (bin/image-sbom);
# PUSH=1 also pushes it there (PUSH=registry/repo:tag elsewhere). Same
# commit, same digest.
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64
HOST_PLATFORM   := linux/$(shell $(GO) env GOARCH)
CHART_VERSION   := $(shell awk '$$1 == "appVersion:" {gsub(/"/, "", $$2); print $$2}' deploy/charts/workload-ca/Chart.yaml)
HUB             ?= ghcr.io/workload-ca
TAG             ?= $(CHART_VERSION)
IMAGE_REF       := $(HUB)/workload-ca:$(TAG)
image: $(BIN)/cyclonedx-gomod ## Build the container image (no Docker needed): bin/image (OCI layout), bin/workload-ca-image.tar, bin/image-sbom; HUB, TAG; PUSH=1 pushes.
	rm -rf $(BIN)/image-sbom && mkdir -p $(BIN)/image-sbom
	for p in $(IMAGE_PLATFORMS); do \
		CGO_ENABLED=0 GOOS=$${p%%/*} GOARCH=$${p#*/} $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' \
			-o $(BIN)/image-bin/$${p//\//-}/workload-ca ./cmd/workload-ca; \
		$(BIN)/cyclonedx-gomod bin -json -std -noserial -notimestamp -version $(VERSION) \
			-output $(BIN)/image-sbom/$${p//\//-}.cdx.json $(BIN)/image-bin/$${p//\//-}/workload-ca; \
	done
	$(GO) run ./deploy/image --version $(VERSION) --revision $$(git rev-parse HEAD) --created $$(git log -1 --format=%ct) \
		$$(for p in $(IMAGE_PLATFORMS); do echo --binary $$p=$(BIN)/image-bin/$${p//\//-}/workload-ca; done) \
		--layout $(BIN)/image --tag $(IMAGE_REF) \
		$(if $(filter $(HOST_PLATFORM),$(IMAGE_PLATFORMS)),--tarball $(BIN)/workload-ca-image.tar --tarball-platform $(HOST_PLATFORM)) \
		$(if $(PUSH),--push $(if $(filter 1,$(PUSH)),$(IMAGE_REF),$(PUSH)))

# cyclonedx-gomod writes the images' SBOMs (tools/sbom/go.mod pins it).
SBOM_TOOLS_DIR := $(CACHE_DIR)/sbom-tools-$(call modkey,tools/sbom)
$(BIN)/cyclonedx-gomod: $(SBOM_TOOLS_DIR)/cyclonedx-gomod FORCE
	$(link-tool)
$(SBOM_TOOLS_DIR)/cyclonedx-gomod:
	$(call cache-build,$(SBOM_TOOLS_DIR),cd tools/sbom && $(GO) build $(RUN_ONLY) -ldflags '$(RUN_ONLY_LDFLAGS)' -o "$$tmp"/cyclonedx-gomod github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod)

# make test runs in two lanes, one per core: the checks (tools, lint,
# generated code, chart, unit tests, fuzzing) and the end-to-end lane (what
# the suite runs, then the suite, which starts as soon as its binaries are
# there, beside the checks). What is built for the cache is built at low
# priority (cache-build), so the tests running beside it keep their pace.
# Every stage is timed: the table is printed at the end and written to
# test-times.txt; the e2e lane's output is shown when it ends
# (.work/e2e-lane.log).
CHECK_LANE  := tools tidy-check vuln config-reference-check lint-code generate-check chart-lint unit fuzz-smoke
E2E_LANE    := os-packages controlplane istiod vault cert-manager spire $(BIN)/local-kms e2e
TEST_TIMES  := $(CURDIR)/test-times.txt
# Not $(MAKE) by name: make runs a recipe line that names it even under -n.
SUBMAKE      = $(MAKE)
STAGE       := $(CURDIR)/tools/stage.sh $(WORK)/test-stages.tsv
CACHED_DEPS  = $(CP_DIR)/kube-apiserver $(CP_DIR)/etcd $(ISTIOD) $(VAULT) $(CERT_MANAGER) $(SPIRE) \
	$(TOOLS_DIR)/golangci-lint $(TOOLS_DIR)/helm $(VULN_TOOLS_DIR)/govulncheck $(VULNDB_DIR)/index/db.json
test: ## Everything CI runs, in two lanes; prints how long each stage took and writes test-times.txt.
	mkdir -p $(WORK)
	$(STAGE) init "$(words $(wildcard $(CACHED_DEPS))) of $(words $(CACHED_DEPS)) cached binaries present in $(CACHE_DIR); Go build cache $$(du -sm $$($(GO) env GOCACHE) 2>/dev/null | cut -f1) MiB, module cache $$(du -sm $$($(GO) env GOMODCACHE) 2>/dev/null | cut -f1) MiB"
	MAKE='$(SUBMAKE)' setsid $(STAGE) lane e2e $(E2E_LANE) > $(WORK)/e2e-lane.log 2>&1 & e2e=$$!; \
	MAKE='$(SUBMAKE)' setsid $(STAGE) lane checks $(CHECK_LANE) & checks=$$!; \
	trap 'kill -- -$$e2e -$$checks 2>/dev/null || true; exit 130' INT TERM HUP; \
	c=0; wait $$checks || c=$$?; \
	lane=0; wait $$e2e || lane=$$?; \
	echo "=== e2e lane (.work/e2e-lane.log) ==="; cat $(WORK)/e2e-lane.log; \
	$(STAGE) report | tee $(TEST_TIMES); \
	exit $$((c || lane))

# Without the cloud KMS SDKs (cmd/workload-ca/kms_cloud.go): no unit test
# opens a cloud key, and they would be compiled once more, with -race.
unit: ## Unit tests (race detector on), fuzz seed corpora included.
	$(GO) test -race -tags nocloudkms -count=1 $(UNIT_PKGS)
	cd tools/vuln && $(GO) test -count=1 ./vulngate

# The suite runs the image's binary too; this machine's platform is enough.
E2E_DEPS := build image controlplane istiod vault cert-manager spire os-packages $(BIN)/helm $(BIN)/local-kms
E2E_ENV   = WORKLOAD_CA_CONTROLPLANE_BIN=$(CP_DIR) WORKLOAD_CA_BINARY=$(BIN)/workload-ca WORKLOAD_CA_IMAGE_LAYOUT=$(BIN)/image \
	WORKLOAD_CA_IMAGE_SBOM=$(BIN)/image-sbom/$(subst /,-,$(HOST_PLATFORM)).cdx.json \
	WORKLOAD_CA_ISTIOD=$(ISTIOD) WORKLOAD_CA_VAULT=$(VAULT) WORKLOAD_CA_CERT_MANAGER=$(CERT_MANAGER) \
	WORKLOAD_CA_SPIRE_SERVER=$(SPIRE) TMPDIR=$(WORK)
e2e e2e-deps: IMAGE_PLATFORMS = $(HOST_PLATFORM)
e2e-deps: $(E2E_DEPS) ## Build (or find cached) everything the e2e suite runs.
e2e: $(E2E_DEPS) ## End-to-end tests against a real kube-apiserver and etcd.
	mkdir -p $(WORK)
	export $(E2E_ENV); \
		$(GO) test -count=1 -timeout 20m ./e2e/... && $(GO) test -count=1 -timeout 10m -run '^TestE2E' $(E2E_PKGS)

# The inner loop (docs/testing.md): lint (vet and golangci-lint over the
# packages changed since CHECK_BASE, buf, tidy, the vulnerability check, the
# chart and the configuration reference only when what they check changed),
# then the unit tests of the changed packages, then their tests against the
# real apiserver (TestE2E*), and the e2e suite's tests in changed e2e files.
CHECK_BASE ?= main
check: tools ## Lint and test what changed since CHECK_BASE (default main), with its e2e tests.
	mkdir -p $(WORK)
	export $(E2E_ENV) MAKE='$(SUBMAKE)' GO='$(GO)' BIN='$(BIN)' UNIT_PKGS="$(UNIT_PKGS)" E2E_PKGS="$(E2E_PKGS)"; \
		tools/check.sh $(CHECK_BASE)

demo: build controlplane ## Run the CA against a local control plane and request certificates as ztunnel would.
	mkdir -p $(WORK)
	WORKLOAD_CA_CONTROLPLANE_BIN=$(CP_DIR) WORKLOAD_CA_BINARY=$(BIN)/workload-ca TMPDIR=$(WORK) \
		$(GO) run ./e2e/demo

bench: build controlplane vault ## Performance at cluster scale: prints a table and writes bench-results.json.
	mkdir -p $(WORK)
	WORKLOAD_CA_CONTROLPLANE_BIN=$(CP_DIR) WORKLOAD_CA_BINARY=$(BIN)/workload-ca WORKLOAD_CA_VAULT=$(VAULT) TMPDIR=$(WORK) GO=$(GO) \
		$(GO) run ./e2e/bench --out $(CURDIR)/bench-results.json $(BENCH_FLAGS)

# The cold start of a cluster of 5,000 nodes, each ztunnel asking for 30
# identities at once (155,000 pods; the fixture alone takes minutes), with
# ztunnel's retries and with a client that retries at once.
# Five rounds of the two storms over one set of fixtures (~25 minutes):
# one storm's time moves with the host by more than a change is worth, so
# the figures are medians of five.
STORM_ROUNDS ?= 5
bench-scale: build controlplane ## The 5,000-node cold-start storm, STORM_ROUNDS rounds: writes bench-results.json and bench-results-storm.png.
	mkdir -p $(WORK)
	WORKLOAD_CA_CONTROLPLANE_BIN=$(CP_DIR) WORKLOAD_CA_BINARY=$(BIN)/workload-ca TMPDIR=$(WORK) GO=$(GO) \
		$(GO) run ./e2e/bench --out $(CURDIR)/bench-results.json --storm-only --storm-ztunnels 5000 --storm-identities 30 --storm-rounds $(STORM_ROUNDS) $(BENCH_FLAGS)

# In make test every parser is fuzzed briefly beyond its seed corpus. The
# budget is a count, not a duration: with a duration, Go 1.26's fuzz
# coordinator can fail a target with a bare "context deadline exceeded" when
# its deadline fires while a starved worker is mid-call (golang/go#75804,
# fixed in Go 1.27); a count has no deadline to race. 20,000 calls is what a
# 3 s run managed on CI's two cores.
fuzz-smoke: ## Run each fuzz target for 20,000 calls.
	$(MAKE) --no-print-directory fuzz FUZZTIME=20000x

fuzz: ## Run each fuzz target for FUZZTIME (default 30s).
	for t in $$(grep -rl --include='*_test.go' '^func Fuzz' . | grep -v '^./e2e/tools' | xargs -n1 dirname | sort -u); do \
		for f in $$(grep -h '^func Fuzz' $$t/*_test.go | sed 's/func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
			$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $${FUZZTIME:-30s} -timeout 10m $$t; \
		done; \
	done

lint: tools vuln config-reference-check tidy-check lint-code ## golangci-lint, buf lint, go vet, govulncheck, the configuration reference current.
lint-code: tools ## go vet, golangci-lint and buf lint alone.
	$(GO) vet ./...
	$(BIN)/golangci-lint run ./...
	cd proto && $(BIN)/buf lint

# Every module of the repository (the product's and those that pin tools)
# is tidy: go.mod names what the code imports, and go.sum nothing more.
GO_MODULES = $$(git ls-files '*go.mod' | xargs -n1 dirname)
tidy-check: ## Fail if a go.mod or go.sum is not what go mod tidy would write.
	for m in $(GO_MODULES); do \
		(cd $$m && $(GO) mod tidy -diff) || { echo "$$m/go.mod is not tidy: run go mod tidy there"; exit 1; }; \
	done

CONFIG_REFERENCE := docs/configuration-reference.md
config-reference: ## Regenerate docs/configuration-reference.md from the flag definitions.
	$(GO) run ./cmd/workload-ca config-reference > $(CONFIG_REFERENCE)

config-reference-check: ## Fail if docs/configuration-reference.md does not match the flags.
	$(GO) run ./cmd/workload-ca config-reference | diff -u $(CONFIG_REFERENCE) - \
		|| { echo "$(CONFIG_REFERENCE) is stale: run make config-reference"; exit 1; }

generate: tools ## Regenerate protobuf code with the pinned generators.
	cd proto && $(BIN)/buf generate

generate-check: tools ## Fail if the committed generated code is stale.
	tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	cd proto && $(BIN)/buf generate --output $$tmp && \
	diff -r $$tmp/capb capb || { echo "generated code is stale: run make generate"; exit 1; }

# Tools, built from tools/go.mod (pinned) into the cache, under a name that
# changes with that module (and the Go that builds it); bin/ links to them,
# where proto/buf.gen.yaml and the e2e suite look.
TOOLS_DIR  := $(CACHE_DIR)/tools-$(call modkey,tools)
TOOL_NAMES := golangci-lint buf protoc-gen-go protoc-gen-go-grpc helm
TOOLS      := $(addprefix $(BIN)/,$(TOOL_NAMES))
tools: $(TOOLS) ## Build the linters, buf, its plug-ins and Helm (cached).
$(TOOLS): $(BIN)/%: $(TOOLS_DIR)/% FORCE
	$(link-tool)
$(addprefix $(TOOLS_DIR)/,golangci-lint buf protoc-gen-go protoc-gen-go-grpc) &:
	$(call cache-build,$(TOOLS_DIR),cd tools && $(GO) build $(RUN_ONLY) -ldflags '$(RUN_ONLY_LDFLAGS)' -o "$$tmp"/ \
		github.com/golangci/golangci-lint/v2/cmd/golangci-lint github.com/bufbuild/buf/cmd/buf \
		google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc)

# Helm stamps its version and the Kubernetes version it assumes at link time.
HELM_VERSION   := $(shell awk '$$1 == "helm.sh/helm/v3" {print $$2}' tools/go.mod)
HELM_K8S_MINOR := $(word 2,$(subst ., ,$(shell awk '$$1 == "k8s.io/client-go" {print $$2}' tools/go.mod)))
HELM_LDFLAGS   := -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$(HELM_K8S_MINOR) \
	-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$(HELM_K8S_MINOR)
$(TOOLS_DIR)/helm:
	$(call cache-build,$(TOOLS_DIR),cd tools && $(GO) build $(RUN_ONLY) -ldflags '$(RUN_ONLY_LDFLAGS) $(HELM_LDFLAGS)' -o "$$tmp"/helm helm.sh/helm/v3/cmd/helm)

CHART := deploy/charts/workload-ca
chart-lint: $(BIN)/helm ## Lint the chart; render it with default values and each ci/*.yaml.
	for v in "" $(wildcard $(CHART)/ci/*.yaml); do \
		$(BIN)/helm lint --strict $(CHART) $${v:+--values $$v}; \
		$(BIN)/helm template workload-ca $(CHART) --namespace workload-ca $${v:+--values $$v} > /dev/null; \
	done

# govulncheck reads the Go vulnerability database offline: the OSV files
# of the golang.org/x/vulndb module pinned in tools/vuln/go.mod, indexed
# by its own indexdb and cached by that version. vulngate fails on a
# vulnerable function the code calls, in a module go.mod can upgrade or in
# the standard library (fixed by raising GOTOOLCHAIN above).
VULNDB_VERSION := $(shell awk '$$1 == "golang.org/x/vulndb" {print $$2}' tools/vuln/go.mod)
VULNDB_DIR     := $(CACHE_DIR)/vulndb-$(VULNDB_VERSION)
VULN_TOOLS_DIR := $(CACHE_DIR)/vuln-tools-$(call modkey,tools/vuln)
$(BIN)/govulncheck $(BIN)/indexdb: $(BIN)/%: $(VULN_TOOLS_DIR)/% FORCE
	$(link-tool)
$(VULN_TOOLS_DIR)/govulncheck $(VULN_TOOLS_DIR)/indexdb &:
	$(call cache-build,$(VULN_TOOLS_DIR),cd tools/vuln && $(GO) build $(RUN_ONLY) -ldflags '$(RUN_ONLY_LDFLAGS)' -o "$$tmp"/ \
		golang.org/x/vuln/cmd/govulncheck golang.org/x/vulndb/cmd/indexdb)
$(VULNDB_DIR)/index/db.json: | $(VULN_TOOLS_DIR)/indexdb
	$(call cache-build,$(VULNDB_DIR),$(VULN_TOOLS_DIR)/indexdb -out "$$tmp" \
		-vulns "$$(cd tools/vuln && $(GO) mod download -json golang.org/x/vulndb | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p')/data/osv")
vuln: $(BIN)/govulncheck $(VULNDB_DIR)/index/db.json ## Known vulnerabilities the code calls (offline database).
	$(BIN)/govulncheck -db file://$(VULNDB_DIR) -format json ./... | (cd tools/vuln && $(GO) run ./vulngate)

# The Debian packages the e2e suite needs, each with the check that says it
# is there; apt-ensure installs those of PACKAGES that are missing, in one
# apt-get (a fresh machine misses them all).
installed.prometheus     = command -v promtool >/dev/null && command -v prometheus >/dev/null
installed.softhsm2       = command -v softhsm2-util >/dev/null
installed.libsqlite3-dev = dpkg -s libsqlite3-dev >/dev/null 2>&1
apt-ensure = missing=$$( { $(foreach p,$(1),$(installed.$(p)) || echo $(p);) } | xargs); \
	[[ -z $$missing ]] || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; }

# promtool and prometheus check the CA's /metrics in the e2e suite: Debian's
# prometheus package (2.42).
prometheus-tools: ## Install promtool and prometheus (Debian package) when missing.
	$(call apt-ensure,prometheus)

# SoftHSM2 is the HSM the e2e suite signs with through PKCS#11
# (--ca-key-uri pkcs11:...): Debian's softhsm2 package.
hsm-tools: ## Install SoftHSM2 (Debian package) when missing.
	$(call apt-ensure,softhsm2)

# libsqlite3-dev: SPIRE's server links Debian's SQLite (see spire).
sqlite-dev:
	$(call apt-ensure,libsqlite3-dev)

os-packages: ## Install what the e2e suite needs from Debian when missing: prometheus, softhsm2, libsqlite3-dev.
	$(call apt-ensure,prometheus softhsm2 libsqlite3-dev)

controlplane: $(CP_DIR)/kube-apiserver $(CP_DIR)/etcd ## Build kube-apiserver and etcd (cached by version).
$(CP_DIR)/kube-apiserver:
	$(call cache-build,$(CP_DIR),cd e2e/tools && $(GO) build $(RUN_ONLY) -ldflags '$(RUN_ONLY_LDFLAGS) $(K8S_LDFLAGS)' -o "$$tmp"/kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver)
$(CP_DIR)/etcd:
	$(call cache-build,$(CP_DIR),cd e2e/tools && $(GO) build $(RUN_ONLY) -ldflags '$(RUN_ONLY_LDFLAGS)' -o "$$tmp"/etcd go.etcd.io/etcd/server/v3)

istiod: $(ISTIOD) ## Build istiod's pilot-discovery for the e2e suite (cached by version).
$(ISTIOD):
	$(call cache-build,$(dir $@),cd e2e/istiotools && $(GO) build $(RUN_ONLY) -ldflags '$(RUN_ONLY_LDFLAGS)' -o "$$tmp"/pilot-discovery istio.io/istio/pilot/cmd/pilot-discovery)

vault: $(VAULT) ## Build Vault for the e2e suite's upstream CA tests (cached by version).
$(VAULT):
	$(call cache-build,$(dir $@),cd e2e/vaulttools && $(GO) build $(RUN_ONLY) -ldflags '$(RUN_ONLY_LDFLAGS)' -o "$$tmp"/vault-server ./vaultserver)

cert-manager: $(CERT_MANAGER) ## Build cert-manager's controllers and copy its CRDs for the e2e suite (cached by version).
$(CERT_MANAGER):
	$(call cache-build,$(dir $@),cd e2e/certmanagertools && $(GO) build $(RUN_ONLY) -ldflags '$(RUN_ONLY_LDFLAGS)' -o "$$tmp"/cm-controller . && \
		mkdir "$$tmp"/crds && cp $$($(GO) list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)/deploy/crds/cert-manager.io_*.yaml "$$tmp"/crds/ && \
		chmod u+w "$$tmp"/crds/*.yaml)

# Its SQLite datastore needs cgo; it links Debian's libsqlite3 (installed
# when missing) rather than compiling SQLite's 250,000 lines of C again.
spire: $(SPIRE) ## Build SPIRE's server for the e2e suite's federation test (cached by version).
$(SPIRE): | sqlite-dev
	$(call cache-build,$(dir $@),cd e2e/spiretools && CGO_ENABLED=1 $(GO) build $(RUN_ONLY) -tags libsqlite3 -ldflags '$(RUN_ONLY_LDFLAGS)' \
		-o "$$tmp"/spire-server github.com/spiffe/spire/cmd/spire-server)

# local-kms emulates the AWS KMS API for the e2e suite's awskms: key URIs
# (e2e/kmstools/go.mod pins it, in a module of its own).
KMS_TOOLS_DIR := $(CACHE_DIR)/kms-tools-$(call modkey,e2e/kmstools)
$(BIN)/local-kms: $(KMS_TOOLS_DIR)/local-kms FORCE
	$(link-tool)
$(KMS_TOOLS_DIR)/local-kms:
	$(call cache-build,$(KMS_TOOLS_DIR),cd e2e/kmstools && $(GO) build $(RUN_ONLY) -ldflags '$(RUN_ONLY_LDFLAGS)' -o "$$tmp"/local-kms github.com/nsmithuk/local-kms)

clean: ## Remove build outputs (keeps what is cached in CACHE_DIR).
	rm -rf $(BIN) $(WORK) .controlplane .vulndb
