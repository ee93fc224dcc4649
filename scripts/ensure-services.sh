#!/usr/bin/env bash
# Make sure the machine's PostgreSQL and Redis answer; start them if installed but down.
# Fails with a clear message when one is absent.
set -euo pipefail
PGHOST=${PGHOST:-127.0.0.1}; PGPORT=${PGPORT:-5432}
REDIS_HOST=${REDIS_HOST:-127.0.0.1}; REDIS_PORT=${REDIS_PORT:-6379}

pg_up() { pg_isready -q -h "$PGHOST" -p "$PGPORT" 2>/dev/null; }
redis_up() { redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; }

if ! pg_up; then
  if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
    echo "ensure-services: starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
    for _ in $(seq 30); do pg_up && break; sleep 1; done
  fi
  pg_up || { echo "ensure-services: PostgreSQL is not reachable on $PGHOST:$PGPORT and is not installed here (apt-get install postgresql)" >&2; exit 1; }
fi
if ! redis_up; then
  if command -v redis-server >/dev/null; then
    echo "ensure-services: starting Redis"
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
    for _ in $(seq 30); do redis_up && break; sleep 1; done
  fi
  redis_up || { echo "ensure-services: Redis is not reachable on $REDIS_HOST:$REDIS_PORT and is not installed here (apt-get install redis-server)" >&2; exit 1; }
fi
echo "ensure-services: PostgreSQL and Redis are up"
