"""Job types used only by the tests (registered on import)."""
