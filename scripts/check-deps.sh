#!/usr/bin/env bash
# The crate graph's never-rules, checked on the normal (non-dev) dependency tree:
# - the product binary links no benchmark code (no cachebench, faultbench or ndpipe-bench);
# - the Tuner reaches PipeStores only over gRPC (ndpipe-tuner never depends on ndpipe-store);
# - the cache library names no ndpipe crate, and nor do its Python bindings (python/spidercache,
#   a workspace of their own).
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
deps() { cargo tree --locked "$@" -e normal --prefix none | awk '{print $1}' | sort -u; }
# forbid CRATE DEP...: CRATE is a workspace member, or a manifest path of its own workspace.
forbid() {
  local crate=$1; shift
  local found which=(-p "$crate")
  [[ $crate == */Cargo.toml ]] && which=(--manifest-path "$crate")
  found=$(deps "${which[@]}" | grep -xE "$(IFS='|'; echo "$*")" || true)
  if [[ -n $found ]]; then
    echo "check-deps: $crate must not depend on: $found" >&2
    fail=1
  fi
}
forbid ndpipe cachebench faultbench ndpipe-bench
forbid ndpipe-tuner ndpipe-store
ndpipe_crates=(ndpipe ndpipe-model ndpipe-catalog ndpipe-store ndpipe-tuner ndpipe-proto ndpipe-util)
forbid spidercache "${ndpipe_crates[@]}"
forbid python/spidercache/Cargo.toml "${ndpipe_crates[@]}"
if ((fail)); then exit 1; fi
echo "check-deps: the crate graph keeps its rules"
