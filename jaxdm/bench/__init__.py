"""AGENT DECISION BENCH (seed 003): L1 isolated items (BFCL v4), L2 recorded DECISION GYM states,
L3 the decision model taking over a running agent (DECISION GYM base / Shift / Hard, ALFWorld)."""
