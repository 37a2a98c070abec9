"""A `transformers` causal LM as a policy (policy.py) and its tokenizer (tokenizer.py)."""
