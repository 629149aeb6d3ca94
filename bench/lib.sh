# Helpers shared by the benchmark scripts (sourced, not run). Every process started here is
# recorded under $work and stopped by `bench_cleanup`, which the scripts run on exit.
# Needs: $work (a scratch directory) set by the caller.

# Every curl a script runs directly is bounded in time (steps run by hyperfine or wrk are
# bounded by `timeout` around them).
curl() { command curl --max-time "${BENCH_CURL_SECONDS:-600}" "$@"; }

# Installs the apt packages that provide the commands named, when any is missing.
bench_need() {  # command=package ...
  "$(dirname "${BASH_SOURCE[0]}")/../scripts/apt-need" "$@"
}

# Stops every process recorded as $work/*.pid (process groups: they run under setsid).
bench_stop_all() {
  for pid in "$work"/*.pid; do
    [ -f "$pid" ] || continue
    kill -- "-$(cat "$pid")" 2>/dev/null || kill "$(cat "$pid")" 2>/dev/null || true
  done
}

bench_cleanup() {
  bench_stop_all
  rm -rf "$work"
}

# Stops the process recorded as $work/NAME.pid, and waits until it is gone.
bench_stop() {  # name
  local file="$work/$1.pid"
  [ -f "$file" ] || return 0
  local pid
  pid=$(cat "$file")
  kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
  for _ in $(seq 500); do kill -0 "$pid" 2>/dev/null || break; sleep 0.01; done
  rm -f "$file"
}

# Fails when something already listens on 127.0.0.1:PORT: a leftover server there would be
# measured in place of the one the script starts.
bench_port_free() {  # port ...
  local port
  for port in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "bench: 127.0.0.1:$port is already in use; stop what listens there first" >&2
      return 1
    fi
  done
}

# Waits until URL answers 2xx, for at most 10 s.
bench_wait() {  # url
  for _ in $(seq 500); do curl -sf -o /dev/null "$1" && return 0; sleep 0.02; done
  echo "bench: $1 did not answer" >&2
  return 1
}

# Starts a moto S3 server on 127.0.0.1:PORT (its own process group, stopped on exit).
bench_start_moto() {  # port
  setsid "$PWD/.venv/tools/bin/moto_server" -H 127.0.0.1 -p "$1" </dev/null >"$work/moto.log" 2>&1 &
  echo $! > "$work/moto.pid"
  for _ in $(seq 300); do curl -s -o /dev/null "http://127.0.0.1:$1" && return 0; sleep 0.1; done
  echo "bench: moto did not start" >&2
  return 1
}

# Every run's time of a hyperfine JSON export: per command, in order, comma-separated.
bench_runs() {  # hyperfine.json
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results']; print(' '.join(','.join(map(str, x['times'])) for x in r))" "$1"
}

# The medians of a hyperfine JSON export, in command order, space-separated.
bench_medians() {  # hyperfine.json
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results']; print(' '.join(str(x['median']) for x in r))" "$1"
}
