"""Bursts of busy work and rest, 0.1 to 0.4 s each, seeded: run beside a timed job on its core, some
of the job's runs share the core throughout, some not at all, most in part, so their times spread
(shorter bursts would average out within every run and only slow them all alike).

    taskset -c 0 python tests/bursts.py

Used by tests/test_timing.py and tools/contention_probe.py; runs until killed."""
import random
import time

random.seed(0)
while True:
    end = time.perf_counter() + random.uniform(0.1, 0.4)
    while time.perf_counter() < end:
        pass
    time.sleep(random.uniform(0.1, 0.4))
