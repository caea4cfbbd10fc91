"""The Lua scripts of the ring's Redis seam (`hashring.store` runs them; its docstring has the key
layout). Each change to membership and placement is one script, so it is atomic and bumps the
epoch once; times come from the Redis server clock (`TIME` inside the script), the ring clock
(`RING_TIME`) standing still during outages. Each script's KEYS and ARGV are listed above it.
"""

from __future__ import annotations

NOW = "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) + tonumber(t[2]) / 1000000\n"
BUMP = "local e = redis.call('INCR', KEYS[{epoch}])\nredis.call('PUBLISH', ARGV[{channel}], e)\n"

# ring_time(key, now, gap, token): notes that Redis answers at `now` (Redis time) and returns the
# ring clock (now minus every gap longer than `gap` seconds with no membership script) and the
# incarnation token (set to `token` if there is none yet; '' when token is '' or the write is
# refused). Writes go through pcall: under OOM or on a read-only replica nothing is stored, and each
# script computes the same ring clock from the last stored `seen`, which then stands still.
RING_TIME = """
local function ring_time(key, now, gap, token)
  local c = redis.call('HMGET', key, 'seen', 'paused', 'incarnation')
  local paused = tonumber(c[2] or '0')
  if c[1] and now - tonumber(c[1]) > gap then
    paused = paused + now - tonumber(c[1])
    redis.pcall('HSET', key, 'paused', string.format('%.6f', paused))
  end
  local inc = c[3]
  if not inc and token ~= '' and type(redis.pcall('HSET', key, 'incarnation', token)) == 'number' then inc = token end
  redis.pcall('HSET', key, 'seen', string.format('%.6f', now))
  return now - paused, inc or ''
end
"""


# KEYS: workers heartbeats live load epoch draining self_draining clock resident   ARGV: id json channel outage_gap_s
# A new registration holds no adapters yet: its heartbeats list them again.
REGISTER = NOW + RING_TIME + """
now = ring_time(KEYS[8], now, tonumber(ARGV[4]), '')
redis.call('HDEL', KEYS[9], ARGV[1])
if redis.call('SREM', KEYS[7], ARGV[1]) == 1 then redis.call('SREM', KEYS[6], ARGV[1]) end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], 0)
""" + BUMP.format(epoch=5, channel=3) + "return e"

# KEYS: workers heartbeats live load epoch clock resident   ARGV: id load channel outage_gap_s resident_json
# Returns -1 if the worker is not registered (Redis lost its data, or it was forgotten),
# the new epoch if it came back to life, else 0. resident_json '' leaves the listed adapters as they are.
HEARTBEAT = NOW + RING_TIME + """
now = ring_time(KEYS[6], now, tonumber(ARGV[4]), '')
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return -1 end
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[7], ARGV[1], ARGV[5]) end
if redis.call('SADD', KEYS[3], ARGV[1]) == 1 then
""" + BUMP.format(epoch=5, channel=3) + """
  return e
end
return 0"""

# KEYS: workers heartbeats live load epoch draining self_draining resident   ARGV: id channel
# A clean leave (a rollout, `kubectl delete pod`) forgets the worker's own shutdown drain but not an
# operator's: that stays in `draining` until `voicering ring undrain`, so the pod comes back drained.
DEREGISTER = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return -1 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[8], ARGV[1])
if redis.call('SREM', KEYS[7], ARGV[1]) == 1 then redis.call('SREM', KEYS[6], ARGV[1]) end
""" + BUMP.format(epoch=5, channel=2) + "return e"

# KEYS: workers draining epoch self_draining   ARGV: id flag(1|0) channel own(1|0)
# A worker's own drain (on shutdown) is marked as its own only if it started it; an operator's
# drain or undrain always clears that mark, so the operator's intent is what survives a restart.
# An operator's drain outlives the worker's record (a clean leave keeps it), so undrain also works
# on a worker that is not registered now, as long as it is still listed as drained.
DRAIN = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and (ARGV[2] == '1' or redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 0) then
  return -1
end
local changed
if ARGV[2] == '1' then
  changed = redis.call('SADD', KEYS[2], ARGV[1])
  if ARGV[4] ~= '1' then redis.call('SREM', KEYS[4], ARGV[1])
  elseif changed == 1 then redis.call('SADD', KEYS[4], ARGV[1]) end
else
  changed = redis.call('SREM', KEYS[2], ARGV[1])
  redis.call('SREM', KEYS[4], ARGV[1])
end
if changed == 0 then return 0 end
""" + BUMP.format(epoch=3, channel=3) + "return e"

# KEYS: hash epoch   ARGV: field value('' deletes) expected('*' = any, '' = absent) channel
# Compare-and-set of one hash field; bumps the epoch only when the value changes.
SET_FIELD = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[3] ~= '*' and (cur or '') ~= ARGV[3] then return -1 end
if (cur or '') == ARGV[2] then return 0 end
if ARGV[2] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
""" + BUMP.format(epoch=2, channel=4) + "return e"

# KEYS: auto epoch auto_raised   ARGV: voice value('' deletes) expected('' = absent) channel
# Compare-and-set of a voice's automatic replica count (as SET_FIELD) that also keeps, in
# `auto_raised`, the Redis time the count last went up: a raise stamps it, a fall or a clear
# deletes it. The cool loop's scale-down hold reads it, so it survives the cool lease moving to
# another process or machine (one clock for all of them).
SWAP_AUTO = NOW + """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (cur or '') ~= ARGV[3] then return -1 end
if (cur or '') == ARGV[2] then return 0 end
if ARGV[2] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
if ARGV[2] ~= '' and tonumber(ARGV[2]) > tonumber(cur or '1') then
  redis.call('HSET', KEYS[3], ARGV[1], string.format('%.6f', now))
else
  redis.call('HDEL', KEYS[3], ARGV[1])
end
""" + BUMP.format(epoch=2, channel=4) + "return e"

# KEYS: auto_raised   ARGV: voice...   Seconds since each voice's automatic count was last raised
# (Redis time), '' for one not raised since it last fell or was cleared.
RAISED_AGES = NOW + """
local out = {}
for i = 1, #ARGV do
  local t = redis.call('HGET', KEYS[1], ARGV[i])
  if t then out[i] = string.format('%.6f', math.max(0, now - tonumber(t))) else out[i] = '' end
end
return out"""

# A decayed counter is "<slow> <since> <fast>": two exponentially decayed request counts (half-lives
# ARGV slow_h and fast_h) as of Redis time <since>; an older two-field value reads as fast = 0.
DECAY = """
local function decayed(cur, now, slow_h, fast_h)
  if not cur then return 0, 0 end
  local a, b, c = string.match(cur, '^(%S+) (%S+) ?(%S*)$')
  local age = math.max(0, now - tonumber(b))
  local fast = 0
  if c and c ~= '' then fast = tonumber(c) * math.pow(0.5, age / fast_h) end
  return tonumber(a) * math.pow(0.5, age / slow_h), fast
end
"""

# KEYS: heat auto fleet warm voices   ARGV: voice count slow_h ttl_ms fast_h max_warm max_indexed
# Adds `count` to the voice's counters and to the fleet's (hash fields slow, fast, since); flags
# the voice in `warm` (for the cool loop) once its fast counter reaches the fleet's `warm_at`; and
# stamps it in the request index (those past the TTL, then the oldest past max_indexed, drop out).
# Returns {slow, fast, auto replicas or ''}.
HEAT = NOW + DECAY + """
local n, slow_h, fast_h = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local slow, fast = decayed(redis.call('GET', KEYS[1]), now, slow_h, fast_h)
slow, fast = slow + n, fast + n
redis.call('SET', KEYS[1], string.format('%.6f %.6f %.6f', slow, now, fast), 'PX', ARGV[4])
local f = redis.call('HMGET', KEYS[3], 'slow', 'since', 'fast', 'warm_at')
local fs, ff = 0, 0
if f[1] and f[2] then fs, ff = decayed(f[1] .. ' ' .. f[2] .. ' ' .. (f[3] or '0'), now, slow_h, fast_h) end
redis.call('HSET', KEYS[3], 'slow', string.format('%.6f', fs + n), 'since', string.format('%.6f', now),
  'fast', string.format('%.6f', ff + n))
if fast >= tonumber(f[4] or '0') and redis.call('SCARD', KEYS[4]) < tonumber(ARGV[6]) then
  redis.call('SADD', KEYS[4], ARGV[1])
end
redis.call('ZADD', KEYS[5], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', string.format('(%.6f', now - tonumber(ARGV[4]) / 1000))
local extra = redis.call('ZCARD', KEYS[5]) - tonumber(ARGV[7])
if extra > 0 then redis.call('ZREMRANGEBYRANK', KEYS[5], 0, extra - 1) end
return {string.format('%.6f', slow), string.format('%.6f', fast), redis.call('HGET', KEYS[2], ARGV[1]) or ''}"""

# KEYS: fleet heat keys...   ARGV: slow_h fast_h
# Returns the fleet's counters then each voice's, decayed to now: {slow, fast, slow, fast, ...}.
PEEK_HEAT = NOW + DECAY + """
local out = {}
local f = redis.call('HMGET', KEYS[1], 'slow', 'since', 'fast')
local s, q = 0, 0
if f[1] and f[2] then s, q = decayed(f[1] .. ' ' .. f[2] .. ' ' .. (f[3] or '0'), now, tonumber(ARGV[1]), tonumber(ARGV[2])) end
out[1], out[2] = string.format('%.6f', s), string.format('%.6f', q)
for i = 2, #KEYS do
  s, q = decayed(redis.call('GET', KEYS[i]), now, tonumber(ARGV[1]), tonumber(ARGV[2]))
  out[2 * i - 1], out[2 * i] = string.format('%.6f', s), string.format('%.6f', q)
end
return out"""

# KEYS: warm spills   Takes (reads and clears) the cool loop's signals: {warm voices, spills hash}.
TAKE_SIGNALS = """
local warm = redis.call('SMEMBERS', KEYS[1])
local spills = redis.call('HGETALL', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2])
return {warm, spills}"""

# KEYS: spills outcome...   ARGV: fast_h ttl_ms, then per outcome key: voice signal spill refusal
# Adds each voice's cool-loop signal to `spills` (taken by the cool loop) and its spills and
# refusals to its decayed outcome counters (read by `voicering status`, never cleared).
ADD_OUTCOMES = NOW + """
local fast_h = tonumber(ARGV[1])
for i = 2, #KEYS do
  local j = 3 + (i - 2) * 4
  local signal, spill, refusal = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
  if signal > 0 then redis.call('HINCRBY', KEYS[1], ARGV[j], signal) end
  if spill + refusal > 0 then
    local f = redis.call('HMGET', KEYS[i], 'spill', 'refusal', 'since')
    local k = 0
    if f[3] then k = math.pow(0.5, math.max(0, now - tonumber(f[3])) / fast_h) end
    redis.call('HSET', KEYS[i], 'spill', string.format('%.6f', tonumber(f[1] or '0') * k + spill),
      'refusal', string.format('%.6f', tonumber(f[2] or '0') * k + refusal), 'since', string.format('%.6f', now))
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
  end
end
return 1"""

# KEYS: outcome...   ARGV: fast_h   Each voice's {spill, refusal} counters, decayed to now.
PEEK_OUTCOMES = NOW + """
local out = {}
for i = 1, #KEYS do
  local f = redis.call('HMGET', KEYS[i], 'spill', 'refusal', 'since')
  local k = 0
  if f[3] then k = math.pow(0.5, math.max(0, now - tonumber(f[3])) / tonumber(ARGV[1])) end
  out[2 * i - 1] = string.format('%.6f', tonumber(f[1] or '0') * k)
  out[2 * i] = string.format('%.6f', tonumber(f[2] or '0') * k)
end
return out"""

# KEYS: lock   ARGV: token ttl_ms   Extends the lease only while `token` still holds it.
RENEW_LOCK = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])"""

# KEYS: lock   ARGV: token   Deletes the lease only while `token` still holds it (compare-and-delete).
RELEASE_LOCK = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])"""

# KEYS: presence, presence-info; ARGV: member, info JSON, forget after (s)
ANNOUNCE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3]))
for _, member in ipairs(gone) do
  redis.call('ZREM', KEYS[1], member)
  redis.call('HDEL', KEYS[2], member)
end
return #gone
"""

# KEYS: presence, presence-info -> {now, member, seen, info, member, seen, info, ...}
PRESENT = """
local t = redis.call('TIME')
local out = {tostring(tonumber(t[1]) + tonumber(t[2]) / 1e6)}
local rows = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #rows, 2 do
  table.insert(out, rows[i])
  table.insert(out, rows[i + 1])
  local info = redis.call('HGET', KEYS[2], rows[i])
  table.insert(out, info or false)
end
return out
"""

# KEYS: workers heartbeats live draining load epoch replicas auto clock resident
# ARGV: ttl_s forget_after_s channel outage_gap_s incarnation_token
# Reaps workers whose heartbeat is older than the TTL (out of `live`, epoch bumped) and forgets
# those silent for forget_after_s, both on the ring clock (outages do not count); then returns the
# whole state in one atomic read, the ring clock as the server time, and the incarnation.
SNAPSHOT = NOW + RING_TIME + """
local incarnation
now, incarnation = ring_time(KEYS[9], now, tonumber(ARGV[4]), ARGV[5])
local changed = false
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', string.format('(%.6f', now - tonumber(ARGV[1])))) do
  if redis.call('SREM', KEYS[3], id) == 1 then changed = true end
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', string.format('(%.6f', now - tonumber(ARGV[2])))) do
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('SREM', KEYS[4], id)
  redis.call('HDEL', KEYS[5], id)
  redis.call('HDEL', KEYS[10], id)
  changed = true
end
local epoch
if changed then
  epoch = redis.call('INCR', KEYS[6])
  redis.call('PUBLISH', ARGV[3], epoch)
else
  epoch = tonumber(redis.call('GET', KEYS[6]) or '0')
end
return {epoch, string.format('%.6f', now),
  redis.call('HGETALL', KEYS[1]), redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES'),
  redis.call('SMEMBERS', KEYS[3]), redis.call('SMEMBERS', KEYS[4]), redis.call('HGETALL', KEYS[5]),
  redis.call('HGETALL', KEYS[7]), redis.call('HGETALL', KEYS[8]), incarnation}"""
