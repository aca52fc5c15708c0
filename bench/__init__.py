"""Benchmarks: Tenure's throughput, latency, recovery and cost, with peers measured alike."""
