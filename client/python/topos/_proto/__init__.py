"""Stubs generated from proto/topos.proto and proto/health.proto by
client/python/regen.sh (do not edit them: regenerate)."""
