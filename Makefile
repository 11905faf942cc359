# gozt: see README.md. Every target is safe to run on a fresh machine.
GO ?= go
PKGS ?= ./...

.PHONY: all build run test test-deps check fmt vet staticcheck bench

all: build

build: ## build the gozt binary into bin/
	$(GO) build -o bin/gozt ./cmd/gozt

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

check: fmt vet staticcheck test ## gofmt, go vet, staticcheck, tests

bench: ## benchmarks (placeholder until the bench harness lands): every Go benchmark once
	$(GO) test -run '^$$' -bench . -benchtime 1x $(PKGS)
