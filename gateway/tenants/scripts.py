"""The registry's changes that span keys, each one atomic Lua script (so gateways sharing a Redis agree)."""

from __future__ import annotations

from typing import Final

__all__ = ["CREATE", "CREATE_PRONUNCIATION", "DELETE_PRONUNCIATION", "DELETE_VOICE", "LOOKUP", "NEW_KEY",
           "REGISTER_VOICE", "REPLACE_PRONUNCIATION", "REVOKE", "SET_FIELDS", "SET_VOICE_PRONUNCIATIONS",
           "UPDATE_VOICE", "VOICE_PRONUNCIATIONS"]

# KEYS: names, tenant, api_keys, tenant_keys. ARGV: name, id, digest, then the tenant's field/value pairs.
CREATE: Final = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 'name' end
if redis.call('EXISTS', KEYS[2]) == 1 then return 'id' end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], unpack(ARGV, 4))
redis.call('HSET', KEYS[3], ARGV[3], ARGV[2])
redis.call('SADD', KEYS[4], ARGV[3])
return 'ok'
"""
# KEYS: api_keys. ARGV: digest, the tenant key base. The whole authentication: one round trip.
LOOKUP: Final = """
local id = redis.call('HGET', KEYS[1], ARGV[1])
if not id then return false end
return redis.call('HGETALL', ARGV[2] .. id)
"""
# KEYS: tenant, tenant_keys, api_keys. Returns how many keys stopped working, or -1 without a tenant.
REVOKE: Final = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
redis.call('HSET', KEYS[1], 'revoked', '1')
local digests = redis.call('SMEMBERS', KEYS[2])
for _, digest in ipairs(digests) do redis.call('HDEL', KEYS[3], digest) end
redis.call('DEL', KEYS[2])
return #digests
"""
# KEYS: tenant, tenant_keys, api_keys. ARGV: digest, id.
NEW_KEY: Final = """
local revoked = redis.call('HGET', KEYS[1], 'revoked')
if not revoked then return 'missing' end
if revoked == '1' then return 'revoked' end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
return 'ok'
"""
# KEYS: tenant. ARGV: field/value pairs. Returns the updated record, or false without a tenant.
SET_FIELDS: Final = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSET', KEYS[1], unpack(ARGV))
return redis.call('HGETALL', KEYS[1])
"""
# KEYS: voices. ARGV: name, record JSON, max_voices. Check and insert in one step: no race past the limit.
# The same record again is 'ok': a call whose answer timed out may have run, and the client sends it
# again (`connect_redis`'s one retry); this very write must not then be refused as taken.
REGISTER_VOICE: Final = """
local kept = redis.call('HGET', KEYS[1], ARGV[1])
if kept == ARGV[2] then return 'ok' end
if kept then return 'exists' end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return 'full' end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 'ok'
"""
# KEYS: voices. ARGV: name, changes as a JSON object. Returns the new record JSON, or false.
UPDATE_VOICE: Final = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return false end
local record = cjson.decode(raw)
for k, v in pairs(cjson.decode(ARGV[2])) do record[k] = v end
raw = cjson.encode(record)
redis.call('HSET', KEYS[1], ARGV[1], raw)
return raw
"""
# KEYS: voices, voice_pronunciations. ARGV: name. Returns the removed record JSON, or false. The
# voice's default dictionaries go with it (a new voice of the same name starts without).
DELETE_VOICE: Final = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if raw then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
end
return raw
"""
# KEYS: pronunciations, pronunciation_index. ARGV: name, record JSON, index JSON, the most a tenant may hold.
# Check and insert in one step: no race past the limit, and never a record without its index entry.
CREATE_PRONUNCIATION: Final = """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 'exists' end
if redis.call('HLEN', KEYS[2]) >= tonumber(ARGV[4]) then return 'full' end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 'ok'
"""
# KEYS: pronunciations, pronunciation_index. ARGV: name, record JSON, index JSON (its created_at is the
# old entry's). Returns the new index JSON, or false when there is no such dictionary.
REPLACE_PRONUNCIATION: Final = """
local old = redis.call('HGET', KEYS[2], ARGV[1])
if not old then return false end
local entry = cjson.decode(ARGV[3])
entry['created_at'] = cjson.decode(old)['created_at']
local raw = cjson.encode(entry)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], raw)
return raw
"""
# KEYS: pronunciations, pronunciation_index, voice_pronunciations. ARGV: name. Returns the removed
# index JSON, false when there is no such dictionary, or {'in_use', voice} when a voice has it as a
# default (a default never names a missing dictionary: detach it first).
DELETE_PRONUNCIATION: Final = """
local old = redis.call('HGET', KEYS[2], ARGV[1])
if not old then return false end
local defaults = redis.call('HGETALL', KEYS[3])
for i = 1, #defaults, 2 do
  for _, name in ipairs(cjson.decode(defaults[i + 1])) do
    if name == ARGV[1] then return {'in_use', defaults[i]} end
  end
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return old
"""
# KEYS: pronunciation_index, voice_pronunciations. ARGV: voice name, names JSON, then the names (none:
# the voice has no default). Returns 'ok', or the first name the tenant has no dictionary of.
SET_VOICE_PRONUNCIATIONS: Final = """
for i = 3, #ARGV do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 then return {'missing', ARGV[i]} end
end
if #ARGV == 2 then redis.call('HDEL', KEYS[2], ARGV[1]) else redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
return 'ok'
"""
# KEYS: pronunciation_index, voice_pronunciations. ARGV: voice name. The voice's default names, each
# followed by its index entry (false: deleted meanwhile), in one round trip: {} when it has none.
VOICE_PRONUNCIATIONS: Final = """
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return {} end
local out = {}
for _, name in ipairs(cjson.decode(raw)) do
  out[#out + 1] = name
  out[#out + 1] = redis.call('HGET', KEYS[1], name)
end
return out
"""
