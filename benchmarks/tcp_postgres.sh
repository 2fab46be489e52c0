#!/usr/bin/env bash
# A TCP PostgreSQL 15 on 127.0.0.1 for the benchmarks' baselines (Spark's JDBC source needs TCP).
#
#     bash benchmarks/tcp_postgres.sh            # start (installing and creating it if needed)
#     bash benchmarks/tcp_postgres.sh stop       # stop it (the data directory stays)
#
# Idempotent: installs Debian's `postgresql` and `libpostgresql-jdbc-java` (the JDBC jar at
# /usr/share/java/postgresql.jar) when missing, creates a cluster in $PGDATA_DIR owned by the
# `postgres` user listening on 127.0.0.1:$PORT only, and a password user and database.
# Prints the DSN to pass as `--dsn`. Needs root (apt-get, and `runuser` to the postgres user).
set -euo pipefail

PORT="${PORT:-5433}"
PGDATA_DIR="${PGDATA_DIR:-/tmp/slicejournal-tcp-pg}"
DB_USER="${DB_USER:-bench}"
DB_PASSWORD="${DB_PASSWORD:-bench}"
DB_NAME="${DB_NAME:-bench}"
BIN=/usr/lib/postgresql/15/bin

as_postgres() { runuser -u postgres -- "$@"; }

if [[ "${1:-start}" == "stop" ]]; then
    as_postgres "$BIN/pg_ctl" -D "$PGDATA_DIR" -m fast stop
    exit 0
fi

if [[ ! -x "$BIN/initdb" || ! -f /usr/share/java/postgresql.jar ]]; then
    apt-get update -q
    apt-get install -y -q postgresql libpostgresql-jdbc-java
fi

if [[ ! -f "$PGDATA_DIR/PG_VERSION" ]]; then
    mkdir -p "$PGDATA_DIR"
    chown postgres:postgres "$PGDATA_DIR"
    chmod 700 "$PGDATA_DIR"
    # Local (socket) connections as the postgres user by peer; TCP needs a password.
    as_postgres "$BIN/initdb" -D "$PGDATA_DIR" --auth-local=peer --auth-host=scram-sha-256 \
        -U postgres >/dev/null
fi

if ! as_postgres "$BIN/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1; then
    as_postgres "$BIN/pg_ctl" -D "$PGDATA_DIR" -l "$PGDATA_DIR/server.log" -w start \
        -o "-c listen_addresses=127.0.0.1 -c port=$PORT -c unix_socket_directories=$PGDATA_DIR"
fi

psql_admin() { as_postgres "$BIN/psql" -h "$PGDATA_DIR" -p "$PORT" -U postgres -qtAX "$@"; }
if [[ -z "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '$DB_USER'")" ]]; then
    psql_admin -c "CREATE ROLE \"$DB_USER\" LOGIN PASSWORD '$DB_PASSWORD'"
fi
if [[ -z "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" ]]; then
    psql_admin -c "CREATE DATABASE \"$DB_NAME\" OWNER \"$DB_USER\""
fi
echo "postgresql://$DB_USER:$DB_PASSWORD@127.0.0.1:$PORT/$DB_NAME"
