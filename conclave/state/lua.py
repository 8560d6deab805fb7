"""The Redis backend's atomic operations, one Lua script each (docs/deploying.md#what-is-shared).
Times come from Redis's own clock (`TIME`), so replicas on different machines agree on cooldowns
and leases."""

from __future__ import annotations

_NOW = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function remaining_ms(opened, cooldown_ms)
  return math.max(0, cooldown_ms - (now_ms() - tonumber(opened or '0')))
end
"""

# KEYS: the held-slots hash (replica -> count), the leases zset (replica -> expiry).
# ARGV: replica, slots wanted, slots in use, the limit, lease ms. Returns the slots now held:
# what was wanted as far as the limit allows, never fewer than those in use (a replica back
# from an outage re-asserts what its calls hold). Dead replicas' slots are freed first.
SLOTS = (
    _NOW
    + """
local now = now_ms()
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, replica in ipairs(dead) do
  redis.call('HDEL', KEYS[1], replica)
  redis.call('ZREM', KEYS[2], replica)
end
redis.call('HDEL', KEYS[1], ARGV[1])
local others = 0
for _, count in ipairs(redis.call('HVALS', KEYS[1])) do others = others + tonumber(count) end
local held = math.min(tonumber(ARGV[2]), tonumber(ARGV[4]) - others)
held = math.max(held, tonumber(ARGV[3]), 0)
if held > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], held)
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), ARGV[1])
else
  redis.call('ZREM', KEYS[2], ARGV[1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return held
"""
)

# KEYS: any number of breaker hashes. ARGV: cooldown ms. Returns state, failures, ms left in
# the cooldown for each.
BREAKER_READ = (
    _NOW
    + """
local out = {}
for _, key in ipairs(KEYS) do
  local b = redis.call('HMGET', key, 'state', 'failures', 'opened')
  local state = b[1] or 'closed'
  local left = 0
  if state == 'open' then left = remaining_ms(b[3], tonumber(ARGV[1])) end
  table.insert(out, state)
  table.insert(out, tonumber(b[2] or '0'))
  table.insert(out, left)
end
return out
"""
)

# KEYS: breaker hash, trial key. ARGV: cooldown ms, trial lease ms, replica.
# Returns {state, granted, ms left, failures}: closed lets the call by; an open breaker whose
# cooldown ended lets exactly one trial by, whichever replica asks first.
BREAKER_TRIAL = (
    _NOW
    + """
local b = redis.call('HMGET', KEYS[1], 'state', 'opened', 'failures')
local failures = tonumber(b[3] or '0')
if b[1] ~= 'open' then return {'closed', 1, 0, failures} end
local left = remaining_ms(b[2], tonumber(ARGV[1]))
if left > 0 then return {'open', 0, left, failures} end
if redis.call('SET', KEYS[2], ARGV[3], 'NX', 'PX', ARGV[2]) then return {'half_open', 1, 0, failures} end
return {'half_open', 0, 0, failures}
"""
)

# KEYS: breaker hash, trial key. ARGV: failure threshold, cooldown ms, replica, ttl ms.
# Returns {state, failures, ms left, opened now (0/1)}.
BREAKER_FAILURE = (
    _NOW
    + """
local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
local was_trial = redis.call('GET', KEYS[2]) == ARGV[3]
if was_trial then redis.call('DEL', KEYS[2]) end
local opened_now = 0
if was_trial or (state == 'closed' and failures >= tonumber(ARGV[1])) then
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened', now_ms())
  state = 'open'
  opened_now = 1
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
local left = 0
if state == 'open' then left = remaining_ms(redis.call('HGET', KEYS[1], 'opened'), tonumber(ARGV[2])) end
return {state, failures, left, opened_now}
"""
)

# KEYS: breaker hash, trial key. A success closes the breaker: closed with no failures is the
# absence of the hash. Returns the state it had.
BREAKER_SUCCESS = """
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
redis.call('DEL', KEYS[1], KEYS[2])
return state
"""

# KEYS: trial key. ARGV: replica. A trial that ended with neither verdict frees its place.
BREAKER_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: the session's egress hash. ARGV: max requests, max bytes, ttl ms.
# Returns {taken (0/1), requests, bytes}.
EGRESS_TAKE = """
local e = redis.call('HMGET', KEYS[1], 'requests', 'bytes')
local requests = tonumber(e[1] or '0')
local bytes = tonumber(e[2] or '0')
if requests >= tonumber(ARGV[1]) or bytes >= tonumber(ARGV[2]) then return {0, requests, bytes} end
requests = redis.call('HINCRBY', KEYS[1], 'requests', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, requests, bytes}
"""

# KEYS: the session's egress hash. ARGV: bytes, ttl ms. Returns {requests, bytes}.
EGRESS_BYTES = """
local bytes = redis.call('HINCRBY', KEYS[1], 'bytes', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {tonumber(redis.call('HGET', KEYS[1], 'requests') or '0'), bytes}
"""

_TERMINAL = """
local function terminal(json)
  local status = cjson.decode(json)['status']
  return status == 'completed' or status == 'failed' or status == 'cancelled'
end
"""

# KEYS: the task. ARGV: the task as JSON, ms it has left. A finished task never changes.
TASK_PUBLISH = (
    _TERMINAL
    + """
local current = redis.call('GET', KEYS[1])
if current and terminal(current) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
)

# KEYS: the task, its cancel flag. ARGV: the time, ISO 8601. Returns the task as it now is, or
# nil when there is none. The flag tells the replica running it to stop.
TASK_CANCEL = (
    _TERMINAL
    + """
local current = redis.call('GET', KEYS[1])
if not current then return false end
if terminal(current) then return current end
local task = cjson.decode(current)
task['status'] = 'cancelled'
task['statusMessage'] = 'cancelled by the client'
task['lastUpdatedAt'] = ARGV[1]
current = cjson.encode(task)
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 1 then ttl = 1000 end
redis.call('SET', KEYS[1], current, 'PX', ttl)
redis.call('SET', KEYS[2], '1', 'PX', ttl)
return current
"""
)

# KEYS: a session's claim. ARGV: replica. Frees the claim only if this replica holds it.
SESSION_RELEASE = BREAKER_RELEASE

SCRIPTS = {
    "slots": SLOTS,
    "breaker_read": BREAKER_READ,
    "breaker_trial": BREAKER_TRIAL,
    "breaker_failure": BREAKER_FAILURE,
    "breaker_success": BREAKER_SUCCESS,
    "breaker_release": BREAKER_RELEASE,
    "egress_take": EGRESS_TAKE,
    "egress_bytes": EGRESS_BYTES,
    "task_publish": TASK_PUBLISH,
    "task_cancel": TASK_CANCEL,
    "session_release": SESSION_RELEASE,
}
