"""NeMo Gym's inference-engine adapters for staged token capture: not implemented here."""
