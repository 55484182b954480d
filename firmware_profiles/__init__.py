"""Device-class profiles (TOML data), validated by runtime.profiles."""
