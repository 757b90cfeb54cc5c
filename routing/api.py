"""Placeholder until this module is written (routing issue, in progress)."""
