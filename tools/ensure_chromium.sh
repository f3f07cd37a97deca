#!/usr/bin/env bash
# Installs Debian's Chromium for the browser tests when it is missing. Needs root and apt-get;
# elsewhere it only says so, and the browser tests skip (except under CI, where they fail loudly).
set -euo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium for the browser tests (apt-get)..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "note: chromium is not installed and cannot be installed here; browser tests will be skipped" >&2
fi
