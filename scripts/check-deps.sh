#!/usr/bin/env bash
# The crate graph's never-rules, checked on the normal (non-dev) dependency tree:
# - the product binary links no benchmark code (no cachebench, faultbench or ndpipe-bench);
# - the Tuner reaches PipeStores only over gRPC (ndpipe-tuner never depends on ndpipe-store);
# - the cache library names no ndpipe crate.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
deps() { cargo tree --locked -p "$1" -e normal --prefix none | awk '{print $1}' | sort -u; }
forbid() {
  local crate=$1; shift
  local found
  found=$(deps "$crate" | grep -xE "$(IFS='|'; echo "$*")" || true)
  if [[ -n $found ]]; then
    echo "check-deps: $crate must not depend on: $found" >&2
    fail=1
  fi
}
forbid ndpipe cachebench faultbench ndpipe-bench
forbid ndpipe-tuner ndpipe-store
forbid spidercache ndpipe ndpipe-model ndpipe-catalog ndpipe-store ndpipe-tuner ndpipe-proto ndpipe-util
if ((fail)); then exit 1; fi
echo "check-deps: the crate graph keeps its rules"
