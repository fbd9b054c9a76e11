"""Weights between stages: versions, their transports, the cast, pairs, fetching."""
