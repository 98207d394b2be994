#!/usr/bin/env bash
# A local Redis Cluster for the tests and CI: 3 masters and 3 replicas on 127.0.0.1.
#
#   scripts/redis-cluster.sh start [PORT_BASE] [DIR]   start it (nothing to do when it is up);
#                                                      prints the seed URL on the last line
#   scripts/redis-cluster.sh stop [PORT_BASE] [DIR]    shut the nodes down and remove DIR
#   scripts/redis-cluster.sh start-node PORT [PORT_BASE] [DIR]
#                                                      restart one node with its own config
#                                                      (tests/redis_cluster.py, after a kill)
#
# The nodes listen on PORT_BASE+1..PORT_BASE+6 (default 7100) and keep their files in
# DIR/PORT (default ${TMPDIR:-/tmp}/statekeeper-redis-cluster-PORT_BASE). Nothing is
# persisted but each node's cluster config (nodes-PORT.conf).
set -euo pipefail

usage() {
  echo "usage: $0 start|stop [PORT_BASE] [DIR]  |  $0 start-node PORT [PORT_BASE] [DIR]" >&2
  exit 2
}

command_name="${1:-}"
shift || true
node_port=""
if [[ "$command_name" == "start-node" ]]; then
  node_port="${1:-}"
  shift || true
  [[ "$node_port" =~ ^[0-9]+$ ]] || usage
fi
PORT_BASE="${1:-7100}"
[[ "$PORT_BASE" =~ ^[0-9]+$ ]] || usage
DIR="${2:-${TMPDIR:-/tmp}/statekeeper-redis-cluster-$PORT_BASE}"
DIR="$(realpath -m "$DIR")" # as a node reports its dir: absolute, symlinks resolved
PORTS=()
for i in 1 2 3 4 5 6; do PORTS+=("$((PORT_BASE + i))"); done
WAIT_SECONDS="${REDIS_CLUSTER_WAIT_SECONDS:-30}"

require_tools() {
  local tool
  for tool in redis-server redis-cli; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "redis-cluster.sh: $tool not found on PATH; install Redis 7 (Debian: apt-get install redis-server)" >&2
      exit 127
    fi
  done
}

cli() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}" 2>/dev/null; }

field() { # field PORT SECTION NAME: one "name:value" field of INFO SECTION (or CLUSTER INFO)
  local out
  if [[ "$2" == cluster-info ]]; then out="$(cli "$1" cluster info)" || return 1
  else out="$(cli "$1" info "$2")" || return 1; fi
  printf '%s\n' "$out" | tr -d '\r' | sed -n "s/^$3://p"
}

all_ok() { # every node answers cluster_state:ok
  local port
  for port in "${PORTS[@]}"; do
    [[ "$(field "$port" cluster-info cluster_state)" == ok ]] || return 1
  done
}

healthy() { # all ok, 6 known nodes, 3 masters with slots, each with 1 replica in sync
  all_ok || return 1
  local port nodes
  for port in "${PORTS[@]}"; do
    [[ "$(field "$port" cluster-info cluster_known_nodes)" == 6 ]] || return 1
    if [[ "$(field "$port" replication role)" == slave ]]; then
      [[ "$(field "$port" replication master_link_status)" == up ]] || return 1
    fi
  done
  nodes="$(cli "${PORTS[0]}" cluster nodes)" || return 1
  # Fields: id addr flags master-id ping pong epoch link slot...; every master owns slots
  # and has exactly one connected replica; no node is flagged fail or pfail.
  printf '%s\n' "$nodes" | tr -d '\r' | awk '
    NF == 0 { next }
    $3 ~ /fail/ || $8 != "connected" { bad = 1 }
    $3 ~ /master/ { masters[$1] = 1; if (NF < 9) bad = 1 }
    $3 ~ /slave/ { replicas[$4]++ }
    END {
      n = 0
      for (id in masters) { n++; if (replicas[id] != 1) bad = 1 }
      exit (bad || n != 3)
    }'
}

wait_for() { # wait_for WHAT COMMAND...: poll COMMAND for up to WAIT_SECONDS
  local what="$1" deadline=$((SECONDS + WAIT_SECONDS))
  shift
  until "$@"; do
    if ((SECONDS >= deadline)); then
      echo "redis-cluster.sh: timed out after ${WAIT_SECONDS}s waiting for $what (logs: $DIR/*/redis.log)" >&2
      return 1
    fi
    sleep 0.1
  done
}

start_node() {
  local port="$1"
  mkdir -p "$DIR/$port"
  # --cluster-replica-validity-factor 0: a replica may always fail over, however long its
  # link was down; --cluster-allow-replica-migration no: replicas stay with their master;
  # --repl-diskless-sync-delay 0: a full sync starts at once instead of after 5 s.
  redis-server --port "$port" --bind 127.0.0.1 --daemonize yes \
    --cluster-enabled yes --cluster-config-file "nodes-$port.conf" \
    --cluster-node-timeout 1000 --cluster-replica-validity-factor 0 \
    --cluster-allow-replica-migration no --repl-diskless-sync-delay 0 \
    --save "" --appendonly no --dir "$DIR/$port" \
    --logfile "$DIR/$port/redis.log" --pidfile "$DIR/$port/redis.pid"
  wait_for "redis-server on port $port to answer" answers "$port"
}

answers() { [[ "$(cli "$1" ping)" == PONG ]]; }

node_dir() { cli "$1" config get dir | tr -d '\r' | sed -n 2p; }

check_ours() { # a server on these ports that is not a node of this DIR is someone else's
  local port
  for port in "${PORTS[@]}"; do
    answers "$port" || continue
    if [[ "$(field "$port" cluster cluster_enabled)" != 1 ]]; then
      echo "redis-cluster.sh: port $port is taken by a Redis that is not a cluster node; left alone" >&2
      return 1
    fi
    if [[ "$(node_dir "$port")" != "$DIR/$port" ]]; then
      echo "redis-cluster.sh: port $port is taken by a cluster node of $(node_dir "$port"), not of $DIR; left alone (pass its DIR)" >&2
      return 1
    fi
  done
}

shutdown_nodes() {
  local port
  for port in "${PORTS[@]}"; do
    if answers "$port"; then cli "$port" shutdown nosave >/dev/null || true; fi
  done
  for port in "${PORTS[@]}"; do
    wait_for "redis-server on port $port to stop" not answers "$port"
  done
}

not() { ! "$@"; }

start() {
  if all_ok; then
    echo "Redis cluster already running on ports ${PORTS[0]}-${PORTS[5]} (files in $(dirname "$(node_dir "${PORTS[0]}")"))"
    echo "redis+cluster://127.0.0.1:${PORTS[0]}"
    return 0
  fi
  local port
  # Leftovers of an earlier cluster of this DIR (a failed start, a killed node) are replaced.
  check_ours || exit 1
  shutdown_nodes
  rm -rf "$DIR"
  for port in "${PORTS[@]}"; do start_node "$port"; done
  local addresses=()
  for port in "${PORTS[@]}"; do addresses+=("127.0.0.1:$port"); done
  redis-cli --cluster create "${addresses[@]}" --cluster-replicas 1 --cluster-yes >"$DIR/create.log" 2>&1 ||
    { cat "$DIR/create.log" >&2; echo "redis-cluster.sh: redis-cli --cluster create failed" >&2; exit 1; }
  wait_for "the cluster to be ok with 3 masters and 3 replicas in sync" healthy
  echo "Redis cluster running on ports ${PORTS[0]}-${PORTS[5]} (files in $DIR)"
  echo "redis+cluster://127.0.0.1:${PORTS[0]}"
}

stop() {
  check_ours || exit 1
  shutdown_nodes
  rm -rf "$DIR"
  echo "Redis cluster on ports ${PORTS[0]}-${PORTS[5]} stopped"
}

require_tools
case "$command_name" in
  start) start ;;
  stop) stop ;;
  start-node)
    [[ " ${PORTS[*]} " == *" $node_port "* ]] || usage
    if answers "$node_port"; then
      echo "redis-cluster.sh: port $node_port already answers" >&2
      exit 1
    fi
    start_node "$node_port"
    ;;
  *) usage ;;
esac
