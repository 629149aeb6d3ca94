-- wrk script for bench/run. With BENCH_SIZE set, every request asks for a random 1 MiB range
-- of a BENCH_SIZE-byte resource, shifted by BENCH_SHIFT bytes (a component's offset inside a
-- stored object); without it, plain GETs. Each thread draws from its own fixed seed, so runs
-- repeat. When done, prints one line the script parses:
--   RESULT requests=N bytes=N seconds=F p50_us=N p99_us=N errors=N
local size = tonumber(os.getenv("BENCH_SIZE") or "")
local shift = tonumber(os.getenv("BENCH_SHIFT") or "0")
local span = 1048576
local threads = 0

function setup(thread)
  thread:set("seed", 20261121 + threads)
  threads = threads + 1
end

function init(args)
  math.randomseed(seed)
end

if size then
  function request()
    local s = shift + math.floor(math.random() * (size - span))
    return wrk.format("GET", nil, { ["Range"] = string.format("bytes=%d-%d", s, s + span - 1) })
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT requests=%d bytes=%d seconds=%.6f p50_us=%d p99_us=%d errors=%d\n",
    summary.requests, summary.bytes, summary.duration / 1e6, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout))
end
