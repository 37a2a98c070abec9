"""The app on top of the plugin: config schema, commands, builders from a config."""
