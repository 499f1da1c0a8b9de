"""The resident-memory figures read from ``/proc/self/status``."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from emgrid.executors import memory

SAMPLE = (b"Name:\tpython\nVmPeak:\t  400000 kB\nVmSize:\t  390000 kB\nVmHWM:\t   51234 kB\n"
          b"VmRSS:\t   49876 kB\nRssAnon:\t   20000 kB\nThreads:\t1\n")


def test_the_fields_are_read_in_bytes_from_their_own_lines():
    assert memory._field_kb(SAMPLE, b"VmHWM") == 51234
    assert memory._field_kb(SAMPLE, b"VmRSS") == 49876
    assert memory._field_kb(SAMPLE, b"RSS") is None  # no line of that name (RssAnon is another)
    assert memory._field_kb(SAMPLE, b"Threads") is None  # not a size in kB
    assert memory._field_kb(SAMPLE.rstrip(b"\n"), b"Threads") is None


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="no /proc")
def test_status_agrees_with_the_file_as_text():
    got = memory._status()
    with open("/proc/self/status") as f:
        text = f.read()
    want = {k: int(v) * 1024 for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(\d+)\s+kB", text, re.MULTILINE)}
    assert set(got) == {"VmRSS", "VmHWM"}
    assert got["VmHWM"] >= got["VmRSS"] > 0
    # the resident set moves between two reads; the peak only when this process grows
    assert abs(got["VmRSS"] - want["VmRSS"]) < 16 << 20


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="no peak reset here")
def test_a_meter_sees_an_allocation_after_it_started():
    meter = memory.PeakMeter()
    block = np.ones(64 << 17)  # 64 MiB, touched
    assert meter.peak_bytes() >= 60 << 20
    del block


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="no peak reset here")
def test_the_local_executor_reports_its_process_peak_above_the_start_of_the_fit():
    from emgrid.executors import optimize
    from emgrid.models import FullGaussian, Mixture

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=(100, 2)), rng.normal(size=(100, 2)) + 4.0])
    model = Mixture([FullGaussian([0.0, 0.0], np.eye(2)), FullGaussian([3.0, 3.0], np.eye(2))], [0.5, 0.5])

    def allocate(it, ll, so_far):
        if it == 1:
            np.ones(64 << 17)  # 64 MiB, touched and freed between two E-steps

    quiet = optimize(x, model, max_iter=3, tol=0.0)
    busy = optimize(x, model, max_iter=3, tol=0.0, callback=allocate)
    assert busy.worker_baseline_bytes["local"] > 0
    assert busy.worker_peak_bytes["local"] >= 60 << 20 > quiet.worker_peak_bytes["local"]
    assert busy.log_likelihood == quiet.log_likelihood


_FAULTS = """
import resource, sys
import numpy as np
from emgrid.executors import memory

def faults():  # minor page faults of 40 blocks of four 3 MiB arrays (12 MiB), each filled and freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(40):
        a = np.empty(3 << 17)
        a.fill(1.0)
        b = a * 2.0
        c = a * b
        d = c - a
        del a, b, c, d
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

faults()
told = faults()
memory.tune_allocator()
faults()
cell = faults()
memory.restore_allocator()
print(told, cell, faults())
"""


@pytest.mark.skipif(memory._libc() is None, reason="not glibc")
def test_a_cell_keeps_its_block_arrays_in_the_heap_even_where_the_environment_trims_at_64_kib():
    """Under Dask's ``MALLOC_TRIM_THRESHOLD_=65536`` every block's arrays were fresh pages
    faulted in again; while a cell holds the process they come from the heap (blocks of
    12 MiB of arrays too: a trimming threshold of 8 MiB handed them back every block), and
    the environment's setting is back after it."""
    import subprocess
    import sys

    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    told, cell, after = map(int, out.stdout.split())
    pages = 40 * (12 << 20) // 4096  # the arrays of every block, in 4 KiB pages
    assert cell < pages // 20, out.stdout  # the cell's allocator reuses the heap
    # the environment's faults them in again (fewer where huge pages back part of each array)
    assert told > 10 * cell and after > 10 * cell, out.stdout
