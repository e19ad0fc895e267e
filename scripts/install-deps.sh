#!/usr/bin/env bash
# Installs what socklane's build, demo and tests need on Debian, as root.
# Idempotent: packages already present are skipped.
set -euo pipefail
pkgs=(clang-19 llvm-19 libbpf-dev linux-libc-dev iproute2 iptables util-linux
      redis-server redis-tools nginx-light curl tcpdump
      qperf sockperf iperf3 dnsmasq-base bind9-dnsutils nftables
      containerd runc containernetworking-plugins
      qemu-system-x86 busybox-static cpio file python3 default-jdk-headless postgresql)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "missing packages: ${missing[*]}; run as root (sudo make deps)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# nginx, redis, postgres and dnsmasq are started by the tests themselves, never as services.
for s in nginx redis-server iperf3 postgresql; do
  command -v systemctl >/dev/null 2>&1 && systemctl disable --now "$s" >/dev/null 2>&1 || true
  [ "$s" = postgresql ] || pkill -x "$s" 2>/dev/null || true
done
