#!/usr/bin/env bash
# Prints the path of golangci-lint, built once from the Go module proxy
# (about a minute cold) and cached by version.
exec "$(dirname "$0")/go-install-cached.sh" golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint v2.15.0
