# Targets for everyday work. `make help` lists them.
GO ?= go

.PHONY: help test race lint bench cover fuzz devstack

help: ## List the targets.
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-10s %s\n", $$1, $$2}'

test: ## Run the tests without -race (quicker; CI runs `make race`).
	$(GO) test -count=1 ./...

race: ## Run the tests with the race detector (the README's test command, what CI runs).
	$(GO) test -race -count=1 ./...

lint: ## gofmt, go vet, staticcheck and go mod tidy -diff on every module (.ci/lint, as CI).
	bash .ci/lint

bench: ## Run the benchmarks once each.
	$(GO) test -run '^$$' -bench . -benchmem ./...

cover: ## Test coverage report in cover.html.
	$(GO) test -coverprofile=cover.out ./...
	$(GO) tool cover -html=cover.out -o cover.html

fuzz: ## Fuzz the Kafka record, MongoDB wire and BSON decoders for 30 s each.
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeAnyFormat$$' -fuzztime 30s ./internal/wire
	$(GO) test -run '^$$' -fuzz FuzzReadMessage -fuzztime 30s ./mongox/internal/wire
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 30s ./mongox/internal/bsonkit

devstack: ## Start embedded MongoDB and Kafka on local ports.
	$(GO) run ./cmd/devstack
