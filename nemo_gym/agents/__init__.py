"""Agent-side internals: the hops an agent makes in a rollout and how their faults are classified."""
