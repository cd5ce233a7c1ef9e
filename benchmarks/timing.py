"""The one timing rule the benchmarks share: warm up, then the median of repeated wall times."""

import statistics
import time


def median_seconds(fn, repeats: int = 7, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
