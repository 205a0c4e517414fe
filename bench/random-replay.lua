-- bench/random-replay.lua: wrk script for bench/scale.sh.  Each request
-- replays one of idem-preload's records at random: key preload-<i>, the
-- request POST /preload with body {"n":<i>} (so the fingerprint matches and
-- idemd answers from the store).  SCALE_N: how many were preloaded.
local n = tonumber(os.getenv("SCALE_N") or "1000000")
math.randomseed(os.time())
request = function()
  local i = math.random(0, n - 1)
  return wrk.format("POST", "/preload",
    {["Content-Type"] = "application/json", ["Idempotency-Key"] = "preload-" .. i},
    '{"n":' .. i .. '}')
end
