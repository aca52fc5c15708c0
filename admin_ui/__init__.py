"""The operator dashboard at /ops/."""
