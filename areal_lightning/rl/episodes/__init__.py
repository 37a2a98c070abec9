"""Multi-turn episodes: the runner (runner.py), environments (environments.py, tool_env.py,
make_environment.py), their settings, evaluation, metrics and training."""
