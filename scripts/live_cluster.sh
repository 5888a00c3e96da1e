#!/bin/bash
# Runs a live pipeline scenario across `meshsim node` processes on several machines (or on this
# one): starts one node per host over ssh (plain processes for 127.0.0.1 / localhost), runs the
# scenario from here with --nodes, and stops the nodes at the end, whatever happens.
#
#   head -c 32 /dev/urandom | base64 > ~/.meshsim-cookie && chmod 600 ~/.meshsim-cookie
#   HOSTS="gpu01 gpu02 gpu03" scripts/live_cluster.sh scenarios/pipeline_small_2shard.toml
#
# Each node listens at HOST:PORT (PORT, default 7001; open it between the hosts). The cookie
# file must be readable at the same path on every host (a shared home, or copy it there);
# it is never put on a command line. Shards go to the hosts in order; hosts beyond the
# shards are spares that take a shard whose node dies.
set -euo pipefail
SCENARIO=${1:?usage: scripts/live_cluster.sh SCENARIO [meshsim run options...]}
shift
MESHSIM=${MESHSIM:-meshsim}
COOKIE=${COOKIE:-$HOME/.meshsim-cookie}
PORT=${PORT:-7001}
HOSTS=${HOSTS:-"127.0.0.1 127.0.0.1"}
pids=()
nodes=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
i=0
for h in $HOSTS; do
    port=$((PORT + i)); i=$((i + 1))
    case "$h" in
        127.0.0.1|localhost) "$MESHSIM" node --listen "127.0.0.1:$port" --cookie-file "$COOKIE" & ;;
        # -tt: the remote node dies with the ssh session when this script ends.
        *) ssh -tt "$h" "$MESHSIM" node --listen "0.0.0.0:$port" --cookie-file "$COOKIE" & ;;
    esac
    pids+=($!)
    nodes+=("$h:$port")
done
# Wait until every node listens.
for n in "${nodes[@]}"; do
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/${n%:*}/${n##*:}") 2>/dev/null && break; sleep 0.1; done
done
"$MESHSIM" run "$SCENARIO" --live --nodes "$(IFS=,; echo "${nodes[*]}")" --cookie-file "$COOKIE" "$@"
