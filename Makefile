# Targets for everyday work. `make help` lists them.
GO ?= go

.PHONY: help test race lint bench cover fuzz devstack

help: ## List the targets.
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-10s %s\n", $$1, $$2}'

test: ## Run the tests (what CI runs, without -race).
	$(GO) test -count=1 ./...

race: ## Run the tests with the race detector (the README's test command).
	$(GO) test -race -count=1 ./...

lint: ## go vet and gofmt.
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi

bench: ## Run the benchmarks once each.
	$(GO) test -run '^$$' -bench . -benchmem ./...

cover: ## Test coverage report in cover.html.
	$(GO) test -coverprofile=cover.out ./...
	$(GO) tool cover -html=cover.out -o cover.html

fuzz: ## Fuzz the wire and BSON decoders for 30 s each.
	$(GO) test -run '^$$' -fuzz FuzzReadMessage -fuzztime 30s ./mongox/internal/wire
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 30s ./mongox/internal/bsonkit

devstack: ## Start embedded MongoDB and Kafka on local ports.
	$(GO) run ./cmd/devstack
