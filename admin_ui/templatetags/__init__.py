"""Template tags of the operator console."""
