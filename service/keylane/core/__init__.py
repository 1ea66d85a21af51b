"""The decision core, no Kafka: KeyRuntime turns one input record and one key's state into a
Decision (activation), the KeyState codec (state), durable timers (timers), the per-key
lanes (lanes), the offset ledger (offsets) and the per-key replay cache of model calls
(replay_cache)."""
