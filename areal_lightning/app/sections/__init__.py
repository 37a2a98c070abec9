"""The sections of the YAML file, one module each: each a dataclass (OmegaConf's schema) with a
docstring under every field and a `check` that refuses impossible values with the key path."""
