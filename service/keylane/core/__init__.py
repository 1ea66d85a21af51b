"""The decision core, no Kafka: KeyRuntime turns one input record and one key's state into a
Decision (activation), applied to a key's table and timer index by one step the worker and
the harness share (apply); a key's outbox and redelivery recognition (outbox), timer fires
and HITL timeouts (timeouts), the KeyState codec (state), durable timers (timers), the
per-key lanes (lanes), the offset ledger (offsets) and the per-key replay cache of model
calls (replay_cache)."""
