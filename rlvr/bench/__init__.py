"""`rlvr bench`: benchmarks with evidence (BENCHMARKS.md has the commands and the numbers).

    rlvr bench efficiency CONFIG [--seeds K]   responses generated per algorithm, and accuracy
    rlvr bench throughput CONFIG               sync vs async vs staged steps/min, overlap bound
    rlvr bench weights [CONFIG]                weight broadcast vs memory copy bandwidth
    rlvr bench transport [CONFIG]              ZeroMQ + codec messages/s, share of a learner step
    rlvr bench plan CONFIG                     `rlvr plan`'s predictions against measured runs

Each writes `<out>/results.json` (with a `targets` block: met or not, with the numbers) and PNG
plots where there are curves (`plots.py`), and prints its tables. The arithmetic is in
`run_metrics.py` (pure, unit tested); `common.py` runs training runs through the same launcher as
`rlvr train`; `cli.py` is the command line, and a bench is one module listed in its `BENCHES`
(its measurement, its flags and their checks).
"""
