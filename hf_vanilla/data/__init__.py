"""Parallel text: loading, the demo task's data, the shared BPE tokenizer, token-budget batching."""
