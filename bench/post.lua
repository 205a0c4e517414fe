-- bench/post.lua - the request every row of `make bench` sends (wrk script).
--
-- A POST / with a small JSON body and an Idempotency-Key header, the same
-- size and shape for every row, so wrk does the same work per request
-- whether it talks to nginx or to idemd (nginx ignores the key).  The
-- request text is built by concatenating two precomputed halves around the
-- key rather than with wrk.format, to keep the client's CPU share small on
-- a machine where wrk, nginx and idemd share the cores.
--
-- Arguments (after `--` on the wrk command line):
--   unique RUNID   a fresh key per request: RUNID-<thread>-<counter>.  RUNID
--                  is random per run, so reruns against one store never
--                  collide; the thread number keeps threads apart.
--   fixed KEY      the same key on every request (the replay row).

local head, tail, prefix, fixed
local n = 0
local threads = 0

-- Runs in wrk's main Lua state, once per thread, before the threads start.
function setup(thread)
   threads = threads + 1
   thread:set("tid", threads)
end

function init(args)
   local mode, arg = args[1], args[2]
   if (mode ~= "unique" and mode ~= "fixed") or arg == nil then
      error("post.lua: arguments are 'unique RUNID' or 'fixed KEY'")
   end
   local body = '{"amount":1250,"currency":"EUR","account":"acct_1","note":"bench"}'
   head = "POST / HTTP/1.1\r\n" ..
          "Host: " .. wrk.headers["Host"] .. "\r\n" ..
          "Content-Type: application/json\r\n" ..
          "Content-Length: " .. string.len(body) .. "\r\n" ..
          "Idempotency-Key: "
   tail = "\r\n\r\n" .. body
   if mode == "fixed" then
      fixed = head .. arg .. tail
   else
      prefix = arg .. "-" .. tostring(tid or 1) .. "-"
   end
end

function request()
   if fixed then
      return fixed
   end
   n = n + 1
   return head .. prefix .. n .. tail
end
