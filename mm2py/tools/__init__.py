"""Operator tools: translate-offsets and verify."""
