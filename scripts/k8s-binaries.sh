#!/usr/bin/env bash
# Builds the Kubernetes API server and etcd the tests run against, from the
# Go module proxy (test/k8s), into a cache keyed by version:
#   /var/cache/socklane/k8s-<version>/{kube-apiserver,etcd}
# A cold build takes several minutes and about 3 GB of memory; later runs
# find the binaries and return at once. Prints the directory.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
version="$(awk '$1 == "k8s.io/kubernetes" {print $2}' "$here/test/k8s/go.mod")"
dir="${SOCKLANE_K8S_CACHE:-/var/cache/socklane}/k8s-$version"
if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ]; then
  echo "$dir"
  exit 0
fi
mkdir -p "$dir"
(cd "$here/test/k8s" && go build -o "$dir/" ./cmd/kube-apiserver ./cmd/etcd) >&2
echo "$dir"
