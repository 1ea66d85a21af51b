"""The benchmark names: a contract shared by the runners, the report and the gate.

seed 000's throughput math is evaluated from these, so they do not change lightly.
"""

from __future__ import annotations

STATE_SIZES_KIB = (1, 16, 64, 100)
FANOUT_SHARDS = (1, 2, 4, 8)
OVERHEAD_TIERS_MS = (50, 500, 2000)
STATE_GROWTH_KIB = (1, 64, 512)  # memory per key; each activation rewrites 1 KiB of it

NOOP_1KEY = "noop_throughput_1key"
NOOP_1000KEYS = "noop_throughput_1000keys"
OVERHEAD = {tier: f"overhead_{tier}ms" for tier in OVERHEAD_TIERS_MS}
TIMER_BASELINE = "timer_baseline_50ms"  # asyncio.sleep(0.05) alone: the event loop's own overshoot
SUSPENSION_ROUNDTRIP = "suspension_roundtrip"
STATE_COMMIT = {kib: f"state_commit_{kib}kib" for kib in STATE_SIZES_KIB}
ENCODE = {kib: f"encode_{kib}kib" for kib in STATE_SIZES_KIB}

E2E_NOOP = "e2e_noop"
PER_KEY_CEILING = "per_key_ceiling"
HOT_KEY_FANOUT = {n: f"hot_key_fanout_n{n}" for n in FANOUT_SHARDS}
LANES = {"key": "lanes_1p_1000keys_key", "partition": "lanes_1p_1000keys_partition"}
STATE_GROWTH = {kib: f"state_growth_{kib}kib" for kib in STATE_GROWTH_KIB}
PEER_AIOKAFKA = "peer_aiokafka_loop"
PEER_FAUST = "peer_faust_table"

RUNTIME = [
    NOOP_1KEY,
    NOOP_1000KEYS,
    *OVERHEAD.values(),
    TIMER_BASELINE,
    SUSPENSION_ROUNDTRIP,
    *STATE_COMMIT.values(),
    *ENCODE.values(),
]
BROKER = [
    E2E_NOOP,
    PER_KEY_CEILING,
    *HOT_KEY_FANOUT.values(),
    *LANES.values(),
    *STATE_GROWTH.values(),
    PEER_AIOKAFKA,
    PEER_FAUST,
]
EXPECTED = RUNTIME + BROKER
