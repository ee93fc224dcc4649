#!/usr/bin/env bash
# Browser tests drive Debian's Chromium (browser downloads are impossible here).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "ensure-chromium: installing Debian chromium"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || { echo "ensure-chromium: apt-get install chromium failed; browser tests will be skipped" >&2; exit 0; }
else
  echo "ensure-chromium: /usr/bin/chromium missing and cannot install (need root + apt); browser tests will be skipped" >&2
fi
