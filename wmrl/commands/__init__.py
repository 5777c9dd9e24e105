"""One module per `wmrl` subcommand: a config dataclass and a `run(cfg)` function."""
