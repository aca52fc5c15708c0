"""The peer systems the benchmarks compare Tenure with, each set up as its documentation
describes, with a handler that does nothing (or reports its start for the latency workload).
"""
