"""Crescent's stand-in for Mooncake's top-level package: only `mooncake.store`."""
