#!/usr/bin/env bash
# Runs a throw-away PostgreSQL server: a new cluster in a temporary folder, listening on a free
# port of 127.0.0.1 only (password authentication), with fsync off. Prints its URL as the one
# line of standard output,
#   postgres://ndpipe:PASSWORD@127.0.0.1:PORT/postgres
# then serves until its standard input closes (or INT, TERM, HUP), and stops the server and
# deletes the folder. Installs Debian's postgresql when it is missing (as root). As root, the
# server runs as the postgres user (initdb refuses root).
#   tools/postgres/run.sh                  # Ctrl-D or Ctrl-C stops it
# The catalog's tests start it themselves unless NDPIPE_TEST_POSTGRES_URL names a server.
set -euo pipefail
trap '' PIPE
log() { echo "[postgres] $*" >&2; }

bin_dir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
BIN=$(bin_dir)
if [[ -z $BIN || ! -x $BIN/initdb ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    log "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb); as root: apt-get install -y postgresql"
    exit 1
  fi
  log "installing Debian's postgresql"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  BIN=$(bin_dir)
  [[ -n $BIN && -x $BIN/initdb ]] || { log "postgresql installed, but no initdb under /usr/lib/postgresql"; exit 1; }
fi

if [[ $(id -u) -eq 0 ]]; then
  id postgres >/dev/null 2>&1 || { log "running as root needs the postgres user (from Debian's package)"; exit 1; }
  as_server() { runuser -u postgres -- "$@"; }
  OWNER=postgres
else
  as_server() { "$@"; }
  OWNER=$(id -un)
fi

DIR=$(mktemp -d "${TMPDIR:-/tmp}/ndpipe-postgres.XXXXXX")
chmod 700 "$DIR"
chown "$OWNER" "$DIR"
stop() {
  as_server "$BIN/pg_ctl" -D "$DIR/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap stop EXIT
trap 'exit 0' INT TERM HUP

PASSWORD=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
printf '%s\n' "$PASSWORD" >"$DIR/password"
chown "$OWNER" "$DIR/password"
if ! as_server "$BIN/initdb" -D "$DIR/data" -U ndpipe --pwfile="$DIR/password" -E UTF8 \
    --no-locale --auth-local=trust --auth-host=scram-sha-256 --no-sync >"$DIR/initdb.log" 2>&1; then
  log "initdb failed:"; cat "$DIR/initdb.log" >&2; exit 1
fi
rm -f "$DIR/password"

for _ in $(seq 1 20); do
  PORT=$((20000 + RANDOM % 40000))
  if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then continue; fi
  if as_server "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
      -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
      start >/dev/null 2>&1; then
    printf 'postgres://ndpipe:%s@127.0.0.1:%s/postgres\n' "$PASSWORD" "$PORT"
    log "serving on 127.0.0.1:$PORT from $DIR until standard input closes"
    cat >/dev/null || true
    exit 0
  fi
done
log "the server did not start; its log:"
tail -n 30 "$DIR/server.log" >&2 || true
exit 1
