"""Engine adapters of worker-owned staging: read and write vLLM's and Megatron Inference's own shapes."""
