# weir — run `make help` for the targets.
SHELL := /bin/bash
GO    ?= go
BIN   := bin/weir
PKGS  := ./...
STATICCHECK := $(shell $(GO) env GOPATH)/bin/staticcheck

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[1m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build bin/weir (static, no cgo: it runs in the vmtest VM too)
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/weir

.PHONY: deps
deps: ## install what the tests need (Debian packages, staticcheck); idempotent
	bash scripts/deps.sh

# The soak tier: long or timing-bound tests, each behind testing.Short()
# (make test's -short skips them). They run alone in make soak; make e2e
# leaves the e2e package's ones out.
SOAK_TESTS := ^(TestDemo|TestE2EMeasureBackArm|TestE2EMeasureTailLoss|TestE2EMeasureHostDialer|TestCaptureMatchesKernel|TestCaptureLossCounted|TestE2EMinRateTBF|TestE2EMinRateTBFContention|TestE2EClusterECMP|TestE2EClusterBurst|TestE2EClusterBurstMoves|TestE2EClusterStall|TestE2EClusterPartition|TestSharesFollowDemand|TestBorrowWait|TestE2EHTTPOverhead|TestTimeWaitReuse|TestLossRatio|TestNoLeak|TestReloadSurvivesTruncateThenWrite|TestSimulate100Instances|TestOffloadTUN|TestWeirBinaryIsLean|TestDeb|TestUnitPrivilegeModel|TestFuzzSmokeFindsEveryTarget|TestE2ELargeWriteSmallBuffers|TestE2EAmplificationBudget|TestE2EConnectionRateSweep|TestE2EFloodFillsFlowTable)$$

.PHONY: test
test: lint ## the unit tier (what a change must pass): lint and go test -short (unit, in-process gVisor and lab tests; no root needed)
	@bash scripts/deps.sh
	$(GO) test -short -count=1 -timeout 10m $(PKGS)

.PHONY: e2e
e2e: ## the end-to-end tier as root: the built binary in network namespaces (cmd/weir/e2e), the demo over a TUN
	@bash scripts/deps.sh
	$(GO) test -count=1 -timeout 30m -skip '$(SOAK_TESTS)' ./cmd/weir/e2e/

.PHONY: soak
soak: ## the soak tier (root for the e2e ones): reload soak, loss ratios, TIME_WAIT reuse, the demo, measure/MinRate/cluster e2e, packaging
	@bash scripts/deps.sh
	$(GO) test -count=1 -timeout 40m -run '$(SOAK_TESTS)' $(PKGS)

# make flaky T=TestName [P=./pkg/] [N=20] [FLAGS=-short]: one test N times
# in one go test run (-count=N, -failfast off), to prove it passes N of N;
# run it beside a parallel load to see what a loaded CI does to it. The
# e2e ones (P=./cmd/weir/e2e/) need root.
T     ?=
P     ?= ./...
N     ?= 20
FLAGS ?=

.PHONY: flaky
flaky: ## run one test N times: make flaky T=TestName P=./pkg/ N=20 (FLAGS=-short)
	@test -n "$(T)" || { echo "make flaky: name the test: T=TestName (P=./pkg/, N=20)"; exit 2; }
	@set -o pipefail; $(GO) test -count=$(N) -timeout 60m $(FLAGS) -run '^($(T))$$' $(P) 2>&1 | \
	  awk '{print} /^--- FAIL/ {f++} END {printf "flaky: %s: %d failed runs of %d\n", "$(T)", f, $(N); exit f > 0}'

.PHONY: race
race: ## the unit tier under the race detector (-short: the soaks run in make soak)
	$(GO) test -race -short -count=1 -timeout 30m $(PKGS)

$(STATICCHECK):
	bash scripts/deps.sh

.PHONY: lint
lint: | $(STATICCHECK) ## gofmt, go vet, staticcheck (installs staticcheck when missing) and go generate's stringer output up to date
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(STATICCHECK) $(PKGS)
	@# the stringer output (go:generate) matches its constants
	@$(GO) generate ./... && if [ -d .git ] && ! git diff --quiet -- '*_string.go' '*_string_linux.go'; then \
	  echo "go generate changed these (commit them):"; git diff --stat -- '*_string.go' '*_string_linux.go'; exit 1; fi

.PHONY: bench
bench: ## all micro-benchmarks, 5 runs each, into bench/out/bench.txt
	@mkdir -p bench/out
	$(GO) test -run '^$$' -bench . -benchmem -count 5 -timeout 60m $(PKGS) | tee bench/out/bench.txt

.PHONY: bench-e2e
bench-e2e: build ## side-by-side benchmark as root: kernel vs HAProxy vs weir (vs PEER_CMD) in 3 namespaces, into bench/out/bench-e2e.{md,json}
	bash scripts/bench-deps.sh
	@mkdir -p bench/out
	$(GO) build -o bin/weirbench ./bench/cmd/weirbench
	./bin/weirbench -weir $(BIN) -out bench/out $(BENCH_FLAGS)

.PHONY: bench-lab
bench-lab: ## in-memory lab benchmarks (no root): connections/s and MB/s through weir against a direct baseline
	@mkdir -p bench/out
	$(GO) test -run '^$$' -bench . -benchtime 3s -count 3 -timeout 30m ./cmd/weir/internal/lab/ | tee bench/out/bench-lab.txt

.PHONY: bench-smoke
bench-smoke: ## every benchmark once, briefly, to prove they run
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 100x -timeout 10m $(PKGS)

FUZZTIME ?= 20000x

.PHONY: fuzz-smoke
fuzz-smoke: ## every fuzz target of the module (found by go test -list) for FUZZTIME each (default 20000x executions; a duration such as 5s also works)
	bash scripts/fuzz-smoke.sh $(FUZZTIME)

.PHONY: demo
demo: build ## run the demo on the embedded default config
	./$(BIN) demo

.PHONY: check
check: build ## weir check on every example config
	@for f in examples/*; do echo "== $$f"; ./$(BIN) check -c $$f || exit 1; done

.PHONY: vmtest
vmtest: build ## end-to-end scenarios inside a QEMU VM with real netem loss (installs qemu, a kernel, busybox: root)
	bash scripts/vm-deps.sh
	$(GO) test -count=1 -timeout 30m ./vmtest/ -run VM -v

.PHONY: deb
deb: ## build dist/weir_<version>_<arch>.deb (static binary, weir@.service, man pages, completions)
	$(GO) run ./packaging/cmd/mkdeb -o dist

.PHONY: clean
clean: ## remove build outputs
	rm -rf bin bench/out
