"""The stages: the agent processor (agent), the effector (effector/), ShardKeys
(shard_keys), and the process runner that starts them as a worker or an effector (worker)."""
