"""The user's tools: the `rlvr` command line, the local launcher, the tiny model's warm start,
benchmarks and run comparison. They use every other package; nothing imports them."""
