#!/usr/bin/env bash
# Builds buf (protobuf lint, breaking-change check and code generation)
# from the Go module proxy into a cache keyed by version,
# /var/cache/socklane/buf-<version>/buf, and prints its path. A cold build
# takes about two minutes; later runs return at once.
set -euo pipefail
version=v1.75.0
dir="${SOCKLANE_TOOL_CACHE:-/var/cache/socklane}/buf-$version"
if [ ! -x "$dir/buf" ]; then
  mkdir -p "$dir"
  GOBIN="$dir" go install "github.com/bufbuild/buf/cmd/buf@$version" >&2
fi
echo "$dir/buf"
