"""Drop-in pieces for RL frameworks that drive R3 themselves (``sglang_r3.integrations.slime``)."""
