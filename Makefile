# socklane build and test entry points. Run as root for anything that
# touches the kernel (demo, test).
GO ?= go
BIN := bin/socklane

.PHONY: help deps generate proto-check proto-baseline build demo test unit kernel-test check-generated metrics-doc k8s-binaries lint clean

help: ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  %-18s %s\n", $$1, $$2}'

deps: ## install system packages (Debian; as root)
	./scripts/install-deps.sh

generate: ## regenerate BPF objects and Go bindings (bpf2go) and the sync protocol's Go code (buf)
	$(GO) generate ./internal/datapath/ ./internal/statesync/ ./internal/bench/bare/ ./internal/sockbugs/
	$$(./scripts/buf.sh) generate

proto-check: ## lint the sync protocol and check it for breaking changes against proto/baseline.binpb (buf)
	$$(./scripts/buf.sh) lint
	$$(./scripts/buf.sh) breaking --against proto/baseline.binpb

proto-baseline: ## make the current protocol the one later changes must stay compatible with
	$$(./scripts/buf.sh) build -o proto/baseline.binpb

build: ## build bin/socklane
	$(GO) build -o $(BIN) ./cmd/socklane

demo: deps build ## two pods, round-trip times with and without the bypass (root)
	./$(BIN) demo

test: deps ## run the whole test suite (root; kernel tests run for real)
	$(GO) vet ./...
	SOCKLANE_K8S_BIN=$$(./scripts/k8s-binaries.sh) $(GO) test -count=1 -p 1 -timeout 40m ./...

kernel-test: deps ## boot Debian's 6.1 and 6.12 kernels in qemu and run the datapath tests inside (root; docs/kernels.md)
	./scripts/kernel-matrix.sh --doc docs/kernels.md

k8s-binaries: ## build (once, cached by version) the Kubernetes API server and etcd the tests use
	./scripts/k8s-binaries.sh

unit: ## every package's tests that need neither root nor the kernel (seconds)
	SOCKLANE_UNIT=1 $(GO) test -count=1 ./...

check-generated: generate ## fail if committed generated files differ from a fresh build
	git diff --exit-code -- internal/datapath/ internal/statesync/ internal/syncpb/ internal/bench/bare/ internal/sockbugs/
	@test -z "$$(git status --porcelain -- internal/syncpb/ internal/statesync/*_bpfel.* internal/bench/bare/*_bpfel.* internal/sockbugs/*_bpfel.*)" || { git status --porcelain -- internal/syncpb/ internal/statesync/ internal/bench/bare/ internal/sockbugs/; echo "generated files above are not committed" >&2; exit 1; }

metrics-doc: ## regenerate docs/metrics.md from the metric definitions
	$(GO) test -count=1 ./internal/metrics/ -run TestDoc -update

lint: ## gofmt, vet and golangci-lint (.golangci.yml; the linter is built once, cached by version)
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: files above need formatting" >&2; exit 1; }
	$(GO) vet ./...
	$$(./scripts/golangci-lint.sh) run ./...

clean: ## remove build outputs
	rm -rf bin
