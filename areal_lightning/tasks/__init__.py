"""Tasks: prompts with reference answers, and the reward that scores a completion against one."""
