"""The example domain and helpers that `slicejournal demo`, the tests and the benchmarks share.

`bank` is the bank-account domain (events, aggregate, balances read model,
workload); `worker_processes` starts, signals and stops `slicejournal worker`
subprocesses. Both ship in the wheel because the demo does.
"""
