"""Validation suite: kalmanscan against independent classic Kalman filters (placeholder docstring)."""
