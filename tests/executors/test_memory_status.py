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
