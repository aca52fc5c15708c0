"""Template tags and filters of the operator dashboard."""
