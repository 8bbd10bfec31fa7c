"""Helpers the test modules import, and the suite's pytest plugins (tiers, ordering)."""
