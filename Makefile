# gozt: see README.md. Every target is safe to run on a fresh machine.
GO ?= go
PKGS ?= ./...
# go.mod's toolchain line names the Go that builds and tests gozt (a patch
# release with the standard library's security fixes); auto lets the go
# command fetch it from the module proxy on a machine whose own Go is older
# (this project's machines set GOTOOLCHAIN=local in their Go's go.env).
GOTOOLCHAIN ?= auto
export GOTOOLCHAIN

.PHONY: all build run test test-deps check fmt vet staticcheck vulncheck bench bench-quick bench-deps image fuzz soak e2e e2e-build e2e-up e2e-down

all: build

build: ## build the gozt binary into bin/
	$(GO) build -o bin/gozt ./cmd/gozt

# make image: a static gozt for linux/GOARCH (this machine's unless GOARCH
# is set) in an OCI image archive that docker load, ctr images import and
# kind load image-archive accept; see deploy/image. The tool asks the binary
# its version; for another architecture it asks a static build for this one.
HOSTARCH = $(shell $(GO) env GOHOSTARCH)
IMAGE_ARCH = $(or $(GOARCH),$(HOSTARCH))
IMAGE_CROSS = $(filter-out $(HOSTARCH),$(IMAGE_ARCH))
IMAGE_TAR ?= bin/gozt-image.tar
STATIC_BUILD = CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath

image: ## the OCI image archive bin/gozt-image.tar (GOARCH=arm64 make image for arm64)
	GOARCH=$(IMAGE_ARCH) $(STATIC_BUILD) -o bin/gozt-linux-$(IMAGE_ARCH) ./cmd/gozt
	$(if $(IMAGE_CROSS),GOARCH=$(HOSTARCH) $(STATIC_BUILD) -o bin/gozt-linux-$(HOSTARCH) ./cmd/gozt)
	GOOS= GOARCH= $(GO) run ./deploy/image -bin bin/gozt-linux-$(IMAGE_ARCH) -o $(IMAGE_TAR) \
		$(if $(IMAGE_CROSS),-version "$$(bin/gozt-linux-$(HOSTARCH) version | sed 's/^gozt //')") $(IMAGEFLAGS)

run: ## run the local demo mesh (gozt local)
	$(GO) run ./cmd/gozt local

test-deps: ## install what the namespaced tests need (as root, with apt-get)
	./scripts/test-deps.sh

test: test-deps ## all three test tiers with the race detector
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

staticcheck:
	$(GO) tool staticcheck $(PKGS)

vulncheck: ## govulncheck against a pinned Go vulnerability database, built offline (scripts/vulncheck.sh)
	./scripts/vulncheck.sh

check: fmt vet staticcheck vulncheck test ## gofmt, go vet, staticcheck, govulncheck, tests

bench: ## side-by-side benchmarks (cmd/gozt-bench); writes bench/results/
	$(GO) run ./cmd/gozt-bench $(BENCHFLAGS)

bench-quick: ## the reviewers' run: every scenario, 3 short repetitions (< 2 min)
	$(GO) run ./cmd/gozt-bench --quick $(BENCHFLAGS)

bench-deps: ## install HAProxy, a peer in the passthrough scenario (as root)
	apt-get install -y -qq haproxy

fuzz: ## every Go fuzz target for FUZZTIME each (default 10s), from its seed corpus
	./scripts/fuzz.sh

# The long soak runs without the race detector: it measures what a
# production build does at scale (1,000 connections opened at once, churn at
# the highest rate), which the detector's 5-10x slow-down would turn into
# connect timeouts; the short soak in `make test` runs with it.
soak: test-deps ## the long soak and churn (TESTPLAN L1, L2): SOAK_CONNS, SOAK_BYTES, SOAK_CHURN to scale
	GOZT_SOAK=1 $(GO) test -count=1 -timeout 60m -run 'TestSoak' -v ./cmd/gozt/internal/local/

gobench: ## every Go benchmark once (what CI's tests also compile)
	$(GO) test -run '^$$' -bench . -benchtime 1x $(PKGS)

# The real-cluster test (as root): a single-node Kubernetes built from the
# upstream modules pinned in e2e/k8s/go.mod, Debian's containerd, Istio's
# istiod and istio-cni from the istio.io/istio version go.mod pins, and gozt
# installed as ztunnel by Istio's chart with deploy/ztunnel-values.yaml. See
# e2e/README.md. make e2e tears the cluster down whether the scenarios pass
# or fail, and prints every component's log when they fail.
E2E = bin/e2e/gozt-e2e
E2E_FLAGS = -repo $(CURDIR)
E2E_TESTFLAGS ?= -v -timeout 30m

e2e-build: image ## build the e2e cluster's binaries and images (bin/e2e)
	cd e2e && CGO_ENABLED=0 $(GO) build -trimpath -o ../$(E2E) ./cmd/e2e
	$(E2E) build $(E2E_FLAGS)

e2e: e2e-build ## bring the cluster up, run the scenarios, tear it down (root)
	@rc=0; \
	$(E2E) up $(E2E_FLAGS) && \
	(cd e2e && CGO_ENABLED=0 GOZT_E2E_KUBECONFIG=$(CURDIR)/bin/e2e/kubeconfig $(GO) test -trimpath -count=1 $(E2E_TESTFLAGS) ./...) || rc=$$?; \
	if [ $$rc -ne 0 ]; then $(E2E) logs $(E2E_FLAGS); fi; \
	$(E2E) down $(E2E_FLAGS) || rc=1; \
	exit $$rc

e2e-up: e2e-build ## bring the cluster up and leave it running: bin/e2e/kubeconfig, kubectl, istioctl
	$(E2E) up $(E2E_FLAGS)

e2e-down: ## tear down what e2e-up left running
	@if [ -x $(E2E) ]; then $(E2E) down $(E2E_FLAGS); else cd e2e && $(GO) run ./cmd/e2e down $(E2E_FLAGS); fi
