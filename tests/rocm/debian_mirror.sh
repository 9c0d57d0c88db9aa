#!/usr/bin/env bash
# Prints the Debian mirror this host's apt uses (its sources.list or deb822 .sources), so the
# ROCm fetch and the sid root use the same one; FERRY_DEBIAN_MIRROR overrides it.
set -euo pipefail
if [ -n "${FERRY_DEBIAN_MIRROR:-}" ]; then echo "$FERRY_DEBIAN_MIRROR"; exit 0; fi
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  # one-line form: deb [opts] URI suite ...; deb822 form: URIs: URI
  uri=$(awk '/^[[:space:]]*deb[[:space:]]/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\//) { print $i; exit } }
             /^URIs:/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\//) { print $i; exit } }' "$f" |
        grep -E '/debian/?$' | head -1 || true)
  if [ -n "$uri" ]; then echo "${uri%/}"; exit 0; fi
done
echo "no Debian mirror in /etc/apt/sources.list(.d); set FERRY_DEBIAN_MIRROR" >&2
exit 1
