# Shared helpers of the scripts left in hack/ (log, die; the demo's daemons). Source it;
# do not run it. The control plane itself is `cargo xtask cluster-up` (xtask/src/cluster).
# shellcheck shell=bash

# shellcheck disable=SC2034 # used by the scripts that source this file
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { echo "[${LOG_TAG:-cluster}] $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

# The executable a daemon's pid file points at must still be ours: guards against pid reuse.
daemon_pid() {
  local name="$1" pid exe
  [[ -f "$STATE_DIR/$name.pid" ]] || return 1
  pid="$(cat "$STATE_DIR/$name.pid" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null)" || return 1
  exe="${exe% (deleted)}" # rebuilt since it started (e.g. cargo replaced the demo's server)
  case "$name" in
    registry) [[ "$exe" == */docker-registry ]] ;;
    *) [[ "$exe" == */"$name" ]] ;;
  esac || return 1
  echo "$pid"
}

# start_daemon NAME CMD...: detached (own session, so a Ctrl-C or a killed test process
# group leaves it running), stdin/stdout/stderr away from our caller's pipes.
start_daemon() {
  local name="$1"
  shift
  local pidfile="$STATE_DIR/$name.pid"
  rm -f "$pidfile"
  # The wrapper writes its own pid and then execs, so the pid file holds the daemon's pid
  # whether or not setsid had to fork.
  # shellcheck disable=SC2016 # $$, $0 and $@ belong to the inner shell
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" \
    </dev/null >>"$STATE_DIR/$name.log" 2>&1 9>&- &
  local i
  for ((i = 0; i < 50; i++)); do
    [[ -s "$pidfile" ]] && return 0
    sleep 0.02
  done
  die "$name did not start (see $STATE_DIR/$name.log)"
}

stop_daemon() {
  local name="$1" pid i
  if pid="$(daemon_pid "$name")"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name ($pid) ignored SIGTERM for 10s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$STATE_DIR/$name.pid"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_port: a loopback port nobody listens on, below the kernel's ephemeral range so
# outgoing connections do not grab it meanwhile. Skips ports already handed out.
TAKEN_PORTS=" "
free_port() {
  local p i
  for ((i = 0; i < 200; i++)); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 12000))
    [[ "$TAKEN_PORTS" == *" $p "* ]] && continue
    port_in_use "$p" && continue
    TAKEN_PORTS+="$p "
    echo "$p"
    return 0
  done
  die "no free loopback port found"
}
