"""Crescent's stand-in for Mooncake's top-level package: `mooncake.store`
(served by Crescent) and `mooncake.mooncake_config`."""
