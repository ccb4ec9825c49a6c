"""Owns POST /tokenize and /detokenize: vLLM's shapes, answered by a worker's tokenizer."""
