"""Tasks: the embedded arithmetic task and its character tokenizer."""
