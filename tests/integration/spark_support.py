"""What the Spark test modules share: the environment Spark needs and the repository's root.

The ``spark`` fixture (one ``local[2]`` session for the whole run) is in ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import sys

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"

#: The repository's root, the working directory of the subprocesses the tests start.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
