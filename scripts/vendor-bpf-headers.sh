#!/usr/bin/env bash
# Vendors the kernel UAPI and libbpf headers the datapath's BPF C is built
# against into internal/datapath/include, so that every build (CI's
# regeneration check included) compiles the same headers whatever the
# host has installed. Only the headers the programs include, transitively,
# are copied, from the installed Debian packages named in
# internal/datapath/include/VERSIONS (install them with
# scripts/install-deps.sh first); the copies keep their SPDX license lines.
#
#   scripts/vendor-bpf-headers.sh          refresh the copies
#   scripts/vendor-bpf-headers.sh --check  fail if they differ from the packages'
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dp="$here/internal/datapath"
inc="$dp/include"
multiarch=/usr/include/x86_64-linux-gnu
check=""
[ "${1:-}" = "--check" ] && check=1

# The packages the copies come from, and the versions they were taken at.
want=$(grep -v '^#' "$inc/VERSIONS")
have=$(dpkg-query -W -f '${Package} ${Version}\n' libbpf-dev linux-libc-dev | sed 's/:amd64//')
if [ "$want" != "$have" ]; then
  echo "vendor-bpf-headers: installed packages differ from include/VERSIONS:" >&2
  echo "installed:"$'\n'"$have"$'\n'"vendored:"$'\n'"$want" >&2
  echo "install the vendored versions, or (to move on) update VERSIONS and run this script" >&2
  [ -n "$check" ] && exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The closure of what the programs include, read from the host's headers.
for c in "$dp"/*.c; do
  clang-19 -M -target bpf -O2 -I"$multiarch" "$c" | tr ' \\' '\n\n' | grep '^/usr/include/' || true
done | sort -u > "$tmp/list"
while read -r f; do
  rel=${f#/usr/include/}
  rel=${rel#x86_64-linux-gnu/}
  mkdir -p "$tmp/include/$(dirname "$rel")"
  cp "$f" "$tmp/include/$rel"
done < "$tmp/list"
cp "$inc/VERSIONS" "$tmp/include/VERSIONS"

if [ -n "$check" ]; then
  diff -r "$tmp/include" "$inc" && exit 0
  echo "vendor-bpf-headers: internal/datapath/include differs from the packages' headers: run scripts/vendor-bpf-headers.sh" >&2
  exit 1
fi
rm -rf "$inc"
mv "$tmp/include" "$inc"
echo "vendored $(wc -l < "$tmp/list") headers into $inc" >&2
