#!/usr/bin/env bash
# Installs the system tools the tests use: iproute2, iptables, nftables and
# curl for the namespaced (tier-3) tests, util-linux's prlimit for the
# fd-exhaustion test, Prometheus for the dashboard test and Chromium for the
# live-view test. It does nothing when they are present, and
# only prints a note when it is not root (those tests then skip loudly, or
# fail under GOZT_REQUIRE_ROOT=1).
set -euo pipefail
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v prlimit >/dev/null 2>&1 || need+=(util-linux)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "test-deps: missing ${need[*]}; not root, so not installing (namespaced tests will skip)" >&2
  exit 0
fi
echo "test-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"
