"""Reservoir's common package: keys, quantities, durations, resource vectors, config, object views."""
