"""What agent authors import: AgentConfig, Complete and Suspend (api), the ActivationContext
an agent runs with (context), its durable Memory, the HITL timeout policies (hitl), per-key
RateLimit, the ToolLoop helper and the tool registry (tools). The public names are
re-exported from ``keylane``."""
