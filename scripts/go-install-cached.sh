#!/usr/bin/env bash
# go-install-cached.sh NAME MODULE/CMD VERSION: builds a Go tool from the
# module proxy once into a cache keyed by version,
# /var/cache/socklane/NAME-VERSION/NAME, and prints its path; later runs
# return at once.
set -euo pipefail
name=$1 pkg=$2 version=$3
dir="${SOCKLANE_TOOL_CACHE:-/var/cache/socklane}/$name-$version"
if [ ! -x "$dir/$name" ]; then
  mkdir -p "$dir"
  GOBIN="$dir" go install "$pkg@$version" >&2
fi
echo "$dir/$name"
