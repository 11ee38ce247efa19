"""Bridges to other ecosystems: TRL reward functions, OpenEnv serving, other frameworks' environments."""
