"""Generation engines behind the policy protocol (rl/policy.py): Hugging Face models (hf/), an in-process
vLLM engine (vllm/), and what every engine reports besides its tokens (generation.py)."""
