"""The read side: health categories and counts, what the database holds back, Prometheus
figures."""
