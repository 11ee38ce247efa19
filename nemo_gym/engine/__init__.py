"""The tiny offline engine pieces: a random-weights causal LM and a real tokenizer with chat templates."""
