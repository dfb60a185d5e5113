# shellcheck shell=bash
# A fresh redis-server for the Redis servers of run.sh and instructions.sh (sourced by both):
# a free port, no persistence, its log in $work. Sets $redis_pid and $redis_port.
redis_pid=""
redis_port=""
start_redis() {
    command -v redis-server >/dev/null || { echo "${0##*/}: redis-server not found (apt-get install redis-server)" >&2; return 1; }
    stop_redis
    redis_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
        --daemonize no >"$work/redis.log" 2>&1 &
    redis_pid=$!
    for _ in $(seq 50); do
        redis-cli -p "$redis_port" ping >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "${0##*/}: redis-server did not answer on $redis_port" >&2; return 1
}
stop_redis() {
    [[ -n $redis_pid ]] || return 0
    kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; redis_pid=""
}
