"""Example jobs and the destinations they talk to."""
