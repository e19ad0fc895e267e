#!/usr/bin/env bash
# The kernel matrix: boots the kernels clusters run (Debian's 6.1 and 6.12
# cloud kernels, from their packages; nothing is installed on the host's
# /boot) in qemu, and runs the datapath's tests inside each, the static test
# binaries of ./internal/kerneltest and ./internal/datapath in a busybox
# initramfs (these kernels build no 9p: results come back on the serial
# console). /dev/kvm here cannot run stock kernels, so qemu emulates (TCG).
#
#   scripts/kernel-matrix.sh [--doc docs/kernels.md] [PACKAGE...]
#
# Packages default to the newest linux-image-6.1.0-*-cloud-amd64-unsigned and
# linux-image-6.12.*+deb12-cloud-amd64-unsigned apt knows. Kernels are cached
# by package version under ${SOCKLANE_KERNEL_CACHE:-/var/cache/socklane/kernels}.
# Exit status 0 only if every test binary passed on every kernel.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${SOCKLANE_KERNEL_CACHE:-/var/cache/socklane/kernels}"
work="$(mktemp -d /tmp/socklane-kmatrix.XXXXXX)"
trap 'rm -rf "$work"' EXIT
doc=""
if [ "${1:-}" = "--doc" ]; then doc="$2"; shift 2; fi
log() { printf 'kernel-matrix: %s\n' "$*" >&2; }

for tool in qemu-system-x86_64 busybox cpio dpkg-deb; do
  command -v "$tool" >/dev/null || { log "$tool is missing: run scripts/install-deps.sh"; exit 2; }
done
busybox=$(command -v busybox)
file -L "$busybox" 2>/dev/null | grep -q 'statically linked' || { log "$busybox is not static: install busybox-static"; exit 2; }

pkgs=("$@")
if [ ${#pkgs[@]} -eq 0 ]; then
  newest() { apt-cache search --names-only "$1" | awk '{print $1}' | sort -V | tail -1; }
  pkgs=("$(newest '^linux-image-6\.1\.0-[0-9]+-cloud-amd64-unsigned$')"
        "$(newest '^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64-unsigned$')")
fi
for p in "${pkgs[@]}"; do [ -n "$p" ] || { log "apt knows no such kernel package (apt-get update?)"; exit 2; }; done

# The tests, static: the guest has no C library.
bins=(kerneltest datapath)
for b in "${bins[@]}"; do
  (cd "$here" && CGO_ENABLED=0 go test -c -trimpath -o "$work/$b.test" "./internal/$b") 
done

cat > "$work/init" <<'INIT'
#!/bin/sh
export PATH=/bin CI=true HOME=/tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
ip link set lo up
echo "SLK kernel $(uname -r)"
rc=0
for t in /tests/*.test; do
  name=$(basename "$t" .test)
  echo "SLK begin $name"
  cd /tmp && "$t" -test.v -test.timeout 20m
  r=$?
  echo "SLK end $name $r"
  [ $r = 0 ] || rc=1
done
echo "SLK exit $rc"
poweroff -f
INIT

overall=0
results="$work/results"
: > "$results"
for pkg in "${pkgs[@]}"; do
  kver=${pkg#linux-image-}; kver=${kver%-unsigned}
  ver=$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')
  kdir="$cache/$kver-${ver:-unknown}"
  if [ ! -f "$kdir/boot/vmlinuz-$kver" ]; then
    log "fetching $pkg $ver"
    mkdir -p "$work/deb" "$kdir"
    (cd "$work/deb" && apt-get download "$pkg" >/dev/null)
    dpkg-deb -x "$work/deb/${pkg}"_*.deb "$kdir"
  fi
  ird="$work/initramfs-$kver"
  mkdir -p "$ird"/{bin,proc,sys,dev,tmp,tests}
  cp "$busybox" "$ird/bin/busybox"
  for a in $("$busybox" --list); do [ "$a" = busybox ] || ln -sf busybox "$ird/bin/$a"; done
  cp "$work/init" "$ird/init"; chmod +x "$ird/init"
  for b in "${bins[@]}"; do cp "$work/$b.test" "$ird/tests/"; done
  (cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) > "$ird.cpio.gz"
  out="$work/$kver.log"
  log "booting $kver (qemu, emulated)"
  start=$(date +%s)
  timeout 1500 qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m 2048 -smp 2 \
    -nodefaults -display none -no-reboot -serial "file:$out" -net none \
    -kernel "$kdir/boot/vmlinuz-$kver" -initrd "$ird.cpio.gz" \
    -append "console=ttyS0 panic=-1 quiet" >/dev/null 2>&1 || true
  secs=$(( $(date +%s) - start ))
  sed -n '/^SLK\|^=== RUN\|^--- \|^    \|^ok\|^FAIL\|^PASS/p' "$out" | tr -d '\r' | sed "s/^/[$kver] /" >&2
  status=$(tr -d '\r' < "$out" | awk '/^SLK exit/ {print $3}' | tail -1)
  [ "$status" = 0 ] || overall=1
  for b in "${bins[@]}"; do
    r=$(tr -d '\r' < "$out" | awk -v b="$b" '$1=="SLK" && $2=="end" && $3==b {print $4}' | tail -1)
    passed=$(tr -d '\r' < "$out" | awk -v b="$b" '$1=="SLK"&&$2=="begin"{on=($3==b)} on && /^--- PASS/ {n++} END {print n+0}')
    failed=$(tr -d '\r' < "$out" | awk -v b="$b" '$1=="SLK"&&$2=="begin"{on=($3==b)} on && /^--- FAIL/ {print $3}' | tr '\n' ' ' || true)
    features=$(tr -d '\r' < "$out" | grep -o 'kernel [^ ]*: {Kernel:[^}]*}, adapted \[[^]]*\]' | head -1 | sed 's/.*{Kernel:[^ ]* //; s/}, adapted/; adapted/' || true)
    printf '%s\t%s\t%s\t%s\t%s\t%ss\t%s\n' "$kver" "$ver" "$b" "${r:-none}" "$passed" "$secs" "${failed:-}" >> "$results"
    [ -z "$features" ] || printf '%s\tfeatures\t%s\n' "$kver" "$features" >> "$results"
  done
done
log "results (kernel, package version, tests, exit, passed, wall, failed):"
sort -u "$results" >&2

if [ -n "$doc" ]; then
  {
    echo "# Kernels"
    echo
    echo "Generated by \`scripts/kernel-matrix.sh --doc $doc\` on $(date -u +%Y-%m-%d) (do not edit)."
    echo "Each kernel booted in qemu runs the static test binaries of"
    echo "\`internal/kerneltest\` (datapath load, bypass integrity, blocking fallback,"
    echo "service load balancing) and \`internal/datapath\` (maps, applies, layout,"
    echo "feature probes); the host kernel runs them in the suite."
    echo
    echo "| kernel | package | tests | result | passed | wall |"
    echo "|---|---|---|---|---:|---:|"
    awk -F'\t' '$2!="features" {printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, ($4=="0"?"pass":"FAIL " $7), $5, $6}' "$results"
    echo "| $(uname -r) (host) | | all | suite | | |"
    echo
    echo "What each kernel offered the datapath (probed at load) and what was adapted:"
    echo
    awk -F'\t' '$2=="features" {printf "- %s: %s\n", $1, $3}' "$results" | sort -u
  } > "$here/$doc"
  log "wrote $doc"
fi
exit $overall
