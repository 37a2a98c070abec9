"""Tasks: the embedded arithmetic task (with its character tokenizer) and GSM8K/MATH-style math from local files."""
