"""Spark sessions the Spark executor starts for a fit, and stops with their JVM.

A session started here (no ``session`` given to :class:`executors.spark_grid.SparkExecutor`)
runs on ``master`` (``local[N]``: the driver on 127.0.0.1 only, no web UI, the Python workers
running this interpreter) and is stopped after the fit together with the JVM PySpark would
leave running.
"""

from __future__ import annotations

import os
import shutil
import sys
from contextlib import suppress

from emgrid.models.errors import ConfigError

from .actors import import_extra


def import_spark():
    import warnings

    # PySpark warns on every DataFrame conversion that it is not tested with pandas 3 (which
    # emgrid's extras install); the conversions emgrid makes work, and the user cannot act on it
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    return import_extra("spark", "pyspark")


def check_java() -> None:
    """ConfigError in one line when no Java runtime is found (Spark runs on one)."""
    home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (home and os.path.exists(os.path.join(home, "bin", "java"))):
        raise ConfigError('the "spark" executor needs a Java 17+ runtime, and no "java" is on PATH (nor JAVA_HOME '
                          "set): install one (Debian/Ubuntu: apt-get install openjdk-17-jre-headless; macOS: brew "
                          "install openjdk@17) or set JAVA_HOME")


def start_session(master: str):
    """A session on ``master`` for one fit: on a local master the driver binds 127.0.0.1
    only, no web UI; its Python workers run this interpreter."""
    import_spark()
    check_java()
    from pyspark.sql import SparkSession

    # PySpark's workers run PYSPARK_PYTHON (default: the first python3 on PATH), read when the
    # context starts: this interpreter, which has emgrid
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName("emgrid")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false"))
    if master.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def stop_session(session) -> None:
    """Stops a session started here, and the JVM it started (PySpark keeps its gateway's JVM
    running after ``stop``), so that a later session starts afresh."""
    from pyspark import SparkContext

    session.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    with suppress(Exception):  # a gateway already gone
        gateway.shutdown()
    if proc is not None:
        with suppress(OSError, AttributeError):
            proc.stdin.close()  # the JVM's launcher exits when its stdin closes
        try:
            proc.wait(10)
        except Exception:  # noqa: BLE001 - still running: ended below
            proc.kill()
            proc.wait()
    SparkContext._gateway = None
    SparkContext._jvm = None


def is_local(sc) -> bool:
    return sc.master.startswith("local")
