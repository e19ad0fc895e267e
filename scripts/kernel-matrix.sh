#!/usr/bin/env bash
# The kernel matrix: boots the kernels clusters run (Debian's 6.1 and 6.12
# cloud kernels, from their packages; nothing is installed on the host's
# /boot) in qemu, and runs the datapath's tests inside each: the static test
# binaries of ./internal/kerneltest, ./internal/datapath, ./internal/sockbugs, ./internal/statesync
# and ./test/e2e in a busybox initramfs (these kernels build no 9p: results
# come back on the serial console). /dev/kvm here cannot run stock kernels, so qemu emulates (TCG).
#
#   scripts/kernel-matrix.sh [--doc docs/kernels.md] [PACKAGE...]
#
# SOCKLANE_MATRIX_KERNELS ("run:PACKAGE refuse:URL@SHA256 ...") and
# SOCKLANE_MATRIX_TESTS ("kerneltest e2e ...") and SOCKLANE_MATRIX_E2E (a
# -test.run pattern) narrow a run by hand; SOCKLANE_MATRIX_KEEP=1 keeps the
# guests' serial logs (/tmp/socklane-kmatrix.*/KVER.log, the tests';
# KVER.kmsg, the kernel's console); SOCKLANE_MATRIX_SILENCE (seconds, 900)
# is how long a guest may print nothing before it is stopped.
#
# Packages default to the newest linux-image-6.1.0-*-cloud-amd64-unsigned and
# linux-image-6.12.*+deb12-cloud-amd64-unsigned apt knows. Kernels are cached
# by package version under ${SOCKLANE_KERNEL_CACHE:-/var/cache/socklane/kernels}.
# Exit status 0 only if every test binary passed on every kernel.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${SOCKLANE_KERNEL_CACHE:-/var/cache/socklane/kernels}"
work="$(mktemp -d /tmp/socklane-kmatrix.XXXXXX)"
trap '[ -n "${SOCKLANE_MATRIX_KEEP:-}" ] || rm -rf "$work"' EXIT
doc=""
if [ "${1:-}" = "--doc" ]; then doc="$2"; shift 2; fi
log() { printf 'kernel-matrix: %s\n' "$*" >&2; }

for tool in qemu-system-x86_64 busybox cpio dpkg-deb; do
  command -v "$tool" >/dev/null || { log "$tool is missing: run scripts/install-deps.sh"; exit 2; }
done
busybox=$(command -v busybox)
file -L "$busybox" 2>/dev/null | grep -q 'statically linked' || { log "$busybox is not static: install busybox-static"; exit 2; }

# Kernels: "run:PACKAGE" must run the datapath's tests; "refuse:URL@SHA256"
# (a package outside apt's sources, pinned by hash) must be refused by name:
# Debian 11's 5.10 lacks program types and helpers the datapath uses.
refuse_deb="http://deb.debian.org/debian/pool/main/l/linux/linux-image-5.10.0-32-cloud-amd64-unsigned_5.10.223-1_amd64.deb"
refuse_sha="b1fb8d34c26105a2ba1271a3df868a9eea460657df98c77fd08822ef4908c9db"
kernels=()
for p in "$@"; do kernels+=("run:$p"); done
[ -z "${SOCKLANE_MATRIX_KERNELS:-}" ] || read -r -a kernels <<< "$SOCKLANE_MATRIX_KERNELS"
if [ ${#kernels[@]} -eq 0 ]; then
  newest() { apt-cache search --names-only "$1" | awk '{print $1}' | sort -V | tail -1; }
  for p in "$(newest '^linux-image-6\.1\.0-[0-9]+-cloud-amd64-unsigned$')" \
           "$(newest '^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64-unsigned$')"; do
    [ -n "$p" ] || { log "apt knows no such kernel package (apt-get update?)"; exit 2; }
    kernels+=("run:$p")
  done
  kernels+=("refuse:$refuse_deb@$refuse_sha")
fi

# The tests, static (the guest has no Go toolchain): the kernel-only tests,
# the state sync's programs, and the end-to-end tests whose outcome
# depends on the kernel: the programs' load and verdicts, the sockmap's
# own behaviour and what the datapath adapts to it (pods on a bridge and
# the socklane command: bypass integrity v4/v6/dual-stack/host and under
# verdict windows, the blocking and remote-peer fallbacks, netns cookies,
# the backlog rule and the valve's refusal, BBR given up for the valve
# (tcp_bbr is among the guest's modules), the message budget, Fast Open,
# service load balancing over the connect/sendmsg/recvmsg/getpeername
# hooks, the per-kernel bypass default, ringbuf events, the policy's
# cgroup_skb programs, bind/getsockname remapping, detaching only one's
# own links, nginx's sendfile). The rest runs on the host only: tests of
# logic in maps and the agent that no kernel changes (tables, quotas,
# service edge cases, takeover, restart, brief connections), tests that
# need what the guest does not carry (containerd, a Kubernetes API
# server), and benchmarks. Everything in a guest is emulated (several
# times slower): this list keeps CI's cold run near 40 minutes.
read -r -a bins <<< "${SOCKLANE_MATRIX_TESTS:-kerneltest datapath sockbugs statesync e2e}"
e2e_run='^(TestBypassIntegrity|TestBlockingIO|TestLoopbackNamespaceIsolation|TestRemotePeerNotRedirected'
e2e_run+='|TestServiceLB|TestBacklogGrace|TestSlowReaderValve|TestValveUnpaced|TestValveWindow|TestMessageBudget|TestFastOpenOrder'
e2e_run+='|TestBypassAuto|TestEvents|TestPolicyTruthTable|TestPortsSideBySide|TestDownRemovesOnlyOwnPins|TestNginx)$'
e2e_run="${SOCKLANE_MATRIX_E2E:-$e2e_run}"
root="$work/root"
mkdir -p "$root"/{bin,usr/bin,proc,sys,dev,tmp,run,tests,etc,lib64,sbin}
mkdir -p "$root/var" && ln -s ../run "$root/var/run"
# A kernel to refuse runs kerneltest's requirement check alone, also in a
# run of other tests (SOCKLANE_MATRIX_TESTS="sockbugs"): build it there.
build=("${bins[@]}")
if [[ " ${kernels[*]} " == *" refuse:"* && " ${bins[*]} " != *" kerneltest "* ]]; then
  build+=(kerneltest)
fi
for b in "${build[@]}"; do
  pkg="./internal/$b"
  [ "$b" = e2e ] && pkg=./test/e2e
  (cd "$here" && CGO_ENABLED=0 go test -c -trimpath -o "$root/tests/$b.test" "$pkg")
done
(cd "$here" && CGO_ENABLED=0 go build -trimpath -o "$root/usr/bin/socklane" ./cmd/socklane)
# Scale (10,000 services, 10,000 connects racing applies, 64 streams of
# 512 KiB each way, slow receivers flooded with 16 MiB) is the host's to
# prove: everything in the guests is emulated. They run -test.short, 32
# streams of 128 KiB each way, and 2 MiB floods where a test does not set
# its own (the blocking-reader and bypass-default tests flooded 64-128 MiB
# a row: 235 and 147 s on 6.12 with 16 MiB floods, 115-123 and 103-106 s
# with 2 MiB).
e2e_flags="-test.short -integrity.conns=32 -integrity.bytes=131072 -integrity.slow-bytes=2097152"
printf '%s\n' "-test.run=$e2e_run $e2e_flags" > "$root/tests/e2e.args"
# The datapath's programs load and run on each kernel; the services'
# table logic at scale (random changes against a full apply, the mirror
# of 10,000 services: a minute and a half emulated) is the host's, which
# writes the same maps through the same calls.
echo "-test.short -test.skip=^(TestUpdateServices|TestApplyMirror)\$" > "$root/tests/datapath.args"
# The state sync's programs on each kernel: the batched lookup against
# each map type, the change records (staged per CPU) and the churn writer (syscall
# programs, bpf_loop, an mmapable array), three nodes converging.
echo "-test.run=^(TestBatchReader|TestApplyLastVersionWins|TestConverge|TestStagedWriteReplicates|TestTracer|TestTraceCapture)\$" > "$root/tests/statesync.args"

# Userland: busybox, and the host's own ip, ss, nft, iptables, nsenter,
# unshare, setpriv and sysctl with the libraries they load (glibc runs on
# any of these kernels).
cp "$busybox" "$root/bin/busybox"
for a in $("$busybox" --list); do [ "$a" = busybox ] || ln -sf busybox "$root/bin/$a"; done
ln -sf ../bin/busybox "$root/sbin/modprobe"
copy_libs() {
  ldd "$1" 2>/dev/null | grep -o '/[^ ]*' | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}
for tool in ip ss nft nsenter unshare setpriv sysctl; do
  src=$(readlink -f "$(command -v "$tool")") || { log "$tool is missing: run scripts/install-deps.sh"; exit 2; }
  cp "$src" "$root/usr/bin/$tool"
  copy_libs "$src"
done
# Real programs, as users run them, where the host has them (CI installs
# them): their tests run in the guest too.
for tool in nginx curl; do
  src=$(command -v "$tool") || continue
  src=$(readlink -f "$src")
  cp "$src" "$root/usr/bin/$tool"
  copy_libs "$src"
done
mkdir -p "$root/var/log/nginx" "$root/var/lib/nginx"
xt=$(readlink -f "$(command -v iptables)")
cp "$xt" "$root/usr/bin/xtables-nft-multi"
copy_libs "$xt"
for a in iptables ip6tables iptables-restore iptables-save; do ln -sf xtables-nft-multi "$root/usr/bin/$a"; done
xtdir=$(dirname "$(ldd "$xt" | grep -o '/[^ ]*libxtables[^ ]*')")/xtables
[ -d "$xtdir" ] || xtdir=/usr/lib/x86_64-linux-gnu/xtables
mkdir -p "$root$xtdir" && cp "$xtdir"/*.so "$root$xtdir/"
for so in "$root$xtdir"/*.so; do copy_libs "$so"; done
printf 'root:x:0:0:root:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\ntcpdump:x:104:104::/tmp:/bin/false\n' > "$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\ntcpdump:x:104:\n' > "$root/etc/group"
echo "nameserver 127.0.0.1" > "$root/etc/resolv.conf"

cat > "$root/init" <<'INIT'
#!/bin/sh
# The guests (Debian's kernels) trace functions: the sync's tracer must load there.
export PATH=/usr/bin:/bin:/sbin CI=true HOME=/tmp SOCKLANE_TEST_BINARY=/usr/bin/socklane SOCKLANE_WANT_TRACING=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
echo /sbin/modprobe > /proc/sys/kernel/modprobe
# The tests write to the second serial port (KVER.log); the kernel's
# console is the first (KVER.kmsg), so its messages (an oops, a panic, a
# warning) never break a test's line and are there when a guest dies.
exec > /dev/ttyS1 2>&1
for m in veth bridge br_netfilter nf_tables nft_compat nft_chain_nat nf_nat nft_ct nft_reject_inet inet_diag tcp_diag udp_diag; do
  modprobe "$m" || echo "SLK modprobe $m failed"
done
ip link set lo up
# As on a node: the quota attacks open tens of thousands of sockets.
ulimit -n 1048576
echo "SLK kernel $(uname -r)"
rc=0
for t in /tests/*.test; do
  name=$(basename "$t" .test)
  args=""
  [ -f "/tests/$name.args" ] && args=$(cat "/tests/$name.args")
  echo "SLK begin $name"
  cd /tmp && "$t" -test.v -test.timeout 50m $args
  r=$?
  echo "SLK end $name $r"
  [ $r = 0 ] || rc=1
done
# The kernel's serious messages (errors and worse) of a guest that lived
# on, in the results too (its console, KVER.kmsg, is kept only by hand).
dmesg -r 2>/dev/null | grep '^<[0-3]>' | tail -40 | sed 's/^/SLKD /'
echo "SLK exit $rc"
poweroff -f
INIT
chmod +x "$root/init"

# modules the guest loads (and the kernel autoloads through modprobe):
# veth, the bridge and netfilter, decompressed (busybox's modprobe reads
# plain .ko) with a modules.dep made for them.
guest_modules() { # KDIR KVER DEST
  local src="$1/lib/modules/$2" dst="$3/lib/modules/$2"
  mkdir -p "$dst"
  (cd "$src" && find kernel/drivers/net/veth.ko* kernel/net/bridge kernel/net/802 kernel/net/llc kernel/net/core \
      kernel/net/ipv4/inet_diag.ko* kernel/net/ipv4/tcp_diag.ko* kernel/net/ipv4/tcp_bbr.ko* kernel/net/ipv4/udp_diag.ko* kernel/net/ipv4/raw_diag.ko* \
      kernel/net/netfilter kernel/net/ipv4/netfilter kernel/net/ipv6/netfilter kernel/lib kernel/crypto \
      -name '*.ko*' 2>/dev/null || true) | while read -r m; do
    mkdir -p "$dst/$(dirname "$m")"
    case "$m" in
      *.xz) xz -dc "$src/$m" > "$dst/${m%.xz}" ;;
      *.zst) zstd -qdc "$src/$m" > "$dst/${m%.zst}" ;;
      *) cp "$src/$m" "$dst/$m" ;;
    esac
  done
  "$busybox" depmod -b "$3" "$2"
}

# Each kernel is prepared in turn (package, initramfs), then all boot side
# by side: a guest's waits (timers, sleeps in the tests) leave the CPU to
# the other. Per kernel: $work/$kver.{mode,ver,bins,log,secs}.
booted=()
# A guest whose tests print nothing for $silence seconds is stopped (its
# log then ends without "SLK exit", which fails the run): the slowest
# test prints a line every few minutes under emulation.
silence="${SOCKLANE_MATRIX_SILENCE:-900}"
boot_kernel() { # KVER KDIR CPIO
  local start pid size last=-1 quiet=0
  start=$(date +%s)
  : > "$work/$1.log"
  timeout 4000 qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m 3072 -smp 2 \
    -nodefaults -display none -no-reboot -serial "file:$work/$1.kmsg" -serial "file:$work/$1.log" -net none \
    -kernel "$2/boot/vmlinuz-$1" -initrd "$3" \
    -append "console=ttyS0 panic=-1 loglevel=5 mitigations=off" >/dev/null 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 5
    size=$(stat -c %s "$work/$1.log" 2>/dev/null || echo 0)
    if [ "$size" != "$last" ]; then last=$size quiet=0; else quiet=$((quiet + 5)); fi
    if [ "$quiet" -ge "$silence" ]; then
      log "$1: no output for ${silence}s: stopping the guest"
      echo "$silence" > "$work/$1.silent"
      kill "$pid" 2>/dev/null || true
      break
    fi
  done
  wait "$pid" || true
  echo $(( $(date +%s) - start )) > "$work/$1.secs"
}
for k in "${kernels[@]}"; do
  mode=${k%%:*} src=${k#*:}
  if [ "$mode" = run ]; then
    pkg=$src
    kver=${pkg#linux-image-}; kver=${kver%-unsigned}
    ver=$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')
  else
    url=${src%@*} sha=${src##*@} deb=$(basename "${src%@*}")
    kver=${deb#linux-image-}; kver=${kver%%-unsigned_*}
    ver=${deb#*-unsigned_}; ver=${ver%_*}
  fi
  kdir="$cache/$kver-${ver:-unknown}"
  if [ ! -f "$kdir/boot/vmlinuz-$kver" ]; then
    log "fetching $kver $ver"
    mkdir -p "$work/deb" "$kdir"
    if [ "$mode" = run ]; then
      (cd "$work/deb" && apt-get download "$pkg" >/dev/null)
    else
      curl -fsSL --retry 3 -o "$work/deb/$deb" "$url"
      echo "$sha  $work/deb/$deb" | sha256sum -c --quiet - || { log "$deb: hash differs from the pinned one"; exit 2; }
    fi
    dpkg-deb -x "$work/deb/"linux-image-*.deb "$kdir"
    rm -f "$work/deb/"*.deb
  fi
  ird="$work/initramfs-$kver"
  rm -rf "$ird" && cp -a "$root" "$ird"
  kbins=("${bins[@]}")
  if [ "$mode" = refuse ]; then
    # Only the refusal: the other tests need what this kernel lacks.
    find "$ird/tests" -type f ! -name kerneltest.test -delete
    echo "-test.run=^TestKernelRequirements\$" > "$ird/tests/kerneltest.args"
    kbins=(kerneltest)
  elif [[ " ${bins[*]} " != *" kerneltest "* ]]; then
    rm -f "$ird/tests/kerneltest.test" # built for the refusal only
  fi
  guest_modules "$kdir" "$kver" "$ird"
  (cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) > "$ird.cpio.gz"
  rm -rf "$ird"
  echo "$mode" > "$work/$kver.mode"
  echo "$ver" > "$work/$kver.ver"
  echo "${kbins[*]}" > "$work/$kver.bins"
  log "booting $kver (qemu, emulated)"
  boot_kernel "$kver" "$kdir" "$ird.cpio.gz" &
  booted+=("$kver")
done
wait

overall=0
results="$work/results"
: > "$results"
for kver in "${booted[@]}"; do
  mode=$(cat "$work/$kver.mode") ver=$(cat "$work/$kver.ver") secs=$(cat "$work/$kver.secs" 2>/dev/null || echo "?")
  read -r -a kbins < "$work/$kver.bins"
  out="$work/$kver.log"
  touch "$out"
  sed -n '/^SLK\|^=== RUN\|^--- \|^    \|^ok\|^FAIL\|^PASS/p' "$out" | tr -d '\r' | sed "s/^/[$kver] /" >&2
  status=$(tr -d '\r' < "$out" | awk '/^SLK exit/ {print $3}' | tail -1)
  if [ -z "$status" ]; then
    # The guest died or was stopped mid-test: its last test line and the
    # kernel's last words.
    why="the guest stopped before the tests ended"
    [ ! -f "$work/$kver.silent" ] || why="no output for $(cat "$work/$kver.silent")s: the guest was stopped"
    last=$(tr -d '\r' < "$out" | grep -E '^(=== RUN|SLK begin)' | tail -1 || true)
    log "$kver: $why, in: ${last:-(no test had begun)}"
    tr -d '\r' < "$work/$kver.kmsg" 2>/dev/null | tail -60 | sed "s/^/[$kver kernel] /" >&2 || true
  fi
  # The requirement check must agree with the matrix: run kernels meet
  # them, the refused one is refused by name.
  want=$([ "$mode" = run ] && echo "SLKR meets" || echo "SLKR refused")
  reqfail=0
  if [[ " ${kbins[*]} " == *" kerneltest "* ]] && ! tr -d '\r' < "$out" | grep "$want" > /dev/null; then
    log "$kver: the requirement check did not say \"$want\""
    status=1 reqfail=1
  fi
  [ "$status" = 0 ] || overall=1
  for b in "${kbins[@]}"; do
    r=$(tr -d '\r' < "$out" | awk -v b="$b" '$1=="SLK" && $2=="end" && $3==b {print $4}' | tail -1)
    passed=$(tr -d '\r' < "$out" | awk -v b="$b" '$1=="SLK"&&$2=="begin"{on=($3==b)} on && /^--- PASS/ {n++} END {print n+0}')
    failed=$(tr -d '\r' < "$out" | awk -v b="$b" '$1=="SLK"&&$2=="begin"{on=($3==b)} on && /^--- FAIL/ {print $3}' | tr '\n' ' ' || true)
    [ "$reqfail" = 0 ] || [ -n "$failed" ] || failed="(the requirement check)"
    label=$b; [ "$mode" = run ] || label="$b (refusal only)"
    printf '%s\t%s\t%s\t%s\t%s\t%ss\t%s\n' "$kver" "$ver" "$label" "${r:-none}" "$passed" "$secs" "${failed:-}" >> "$results"
  done
  features=$(tr -d '\r' < "$out" | grep -o 'SLKF .*' | head -1 | sed 's/^SLKF //' || true)
  [ -z "$features" ] || printf '%s\tfeatures\t%s\n' "$kver" "$features" >> "$results"
  refusal=$(tr -d '\r' < "$out" | grep -o 'SLKR refused .*' | head -1 | sed 's/^SLKR refused //' || true)
  [ -z "$refusal" ] || printf '%s\tfeatures\trefused: %s\n' "$kver" "$refusal" >> "$results"
done
log "results (kernel, package version, tests, exit, passed, wall, failed):"
sort -u "$results" >&2

if [ -n "$doc" ]; then
  {
    echo "# Kernels"
    echo
    echo "Generated by \`scripts/kernel-matrix.sh --doc $doc\` on $(date -u +%Y-%m-%d) (do not edit)."
    echo "Each kernel booted in qemu runs the static test binaries of"
    echo "\`internal/kerneltest\` (requirements, datapath load, bypass integrity,"
    echo "verdict windows and exact byte counts, blocking fallback, service load"
    echo "balancing), \`internal/datapath\` (maps,"
    echo "applies, layout, feature probes), \`internal/sockbugs\` (the known sockmap"
    echo "bugs, found by behaviour), \`internal/statesync\` (the state sync's programs:"
    echo "the batched lookup, change records, three nodes converging) and the"
    echo "end-to-end tests that prove the datapath"
    echo "with pods on a bridge and the \`socklane\` command:"
    echo
    echo "\`$e2e_run\`"
    echo
    echo "(run with \`$e2e_flags\`, and the datapath tests with \`-test.short\`:"
    echo "the guest's CPU is emulated; the host proves the scale). The"
    echo "other end-to-end tests run on the host only: logic in maps and the agent"
    echo "that no kernel changes (tables, quotas, service edge cases, takeover,"
    echo "restart, brief connections), what the guest does not carry (containerd,"
    echo "a Kubernetes API server), and benchmarks. The host kernel runs the whole suite."
    echo "Debian 11's 5.10 lacks"
    echo "what the datapath's programs use: it must be refused by name, with nothing"
    echo "pinned or attached (\`TestKernelRequirements\`)."
    echo
    echo "| kernel | package | tests | result | passed | wall |"
    echo "|---|---|---|---|---:|---:|"
    awk -F'\t' '$2!="features" {printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, (($4=="0" && $7=="")?"pass":"FAIL " $7), $5, $6}' "$results"
    echo "| $(uname -r) (host) | | all | suite | | |"
    echo
    echo "What each kernel offered the datapath (probed at load), what was adapted,"
    echo "and the sockmap bugs found by behaviour (\`internal/sockbugs\`: FIONREAD and"
    echo "MSG_PEEK on redirected bytes, splice(2), a blocking read interrupted by a"
    echo "signal):"
    echo
    awk -F'\t' '$2=="features" {printf "- %s: %s\n", $1, $3}' "$results" | sort -u
  } > "$here/$doc"
  log "wrote $doc"
fi
exit $overall
