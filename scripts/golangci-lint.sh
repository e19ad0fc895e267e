#!/usr/bin/env bash
# Builds golangci-lint from the Go module proxy into a cache keyed by
# version, /var/cache/socklane/golangci-lint-<version>/golangci-lint, and
# prints its path. A cold build takes about a minute; later runs return at
# once.
set -euo pipefail
version=v2.15.0
dir="${SOCKLANE_TOOL_CACHE:-/var/cache/socklane}/golangci-lint-$version"
if [ ! -x "$dir/golangci-lint" ]; then
  mkdir -p "$dir"
  GOBIN="$dir" go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$version" >&2
fi
echo "$dir/golangci-lint"
