"""Benchmarks: reproducible workloads, tables, reports (``speclane bench SCENARIO``)."""
