#!/usr/bin/env bash
# Installs what Meridian needs on a fresh Debian machine (only what is missing),
# then the package itself into .venv. Safe to run again: a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
# prometheus: promtool checks deploy/prometheus/ and the demo runs the server.
for pkg in etcd-server postgresql libxxhash-dev libzstd-dev rdiff xdelta3 zstd rsync \
           clang libclang-rt-14-dev make gcc prometheus; do
  have_pkg "$pkg" || need+=("$pkg")
done
command -v java >/dev/null || need+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || need+=(maven)
command -v go >/dev/null || need+=(golang-go)

if ((${#need[@]})); then
  echo "bootstrap: installing ${need[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
echo "bootstrap: ready ($(.venv/bin/meridian --version))" >&2
