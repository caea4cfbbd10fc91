"""The registry's changes that span keys, each one atomic Lua script (so gateways sharing a Redis agree)."""

from __future__ import annotations

from typing import Final

__all__ = ["CREATE", "DELETE_VOICE", "LOOKUP", "NEW_KEY", "REGISTER_VOICE", "REVOKE", "SET_FIELDS", "UPDATE_VOICE"]

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
REGISTER_VOICE: Final = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 'exists' end
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
# KEYS: voices. ARGV: name. Returns the removed record JSON, or false.
DELETE_VOICE: Final = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if raw then redis.call('HDEL', KEYS[1], ARGV[1]) end
return raw
"""
