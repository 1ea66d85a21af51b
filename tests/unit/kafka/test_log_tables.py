"""The worker logs Faust's boxed tables on one line (service/keylane/kafka/app.py)."""

from __future__ import annotations

import logging

from faust.types import TP

from keylane.catalog import load_catalog
from keylane.config import Settings
from keylane.kafka.app import Worker, build_app, tables_on_one_line

ASSIGNED = """[2026-12-02 08:47:33,696] [14186] [INFO] Setting newly assigned partitions
+Topic Partition Set---------------------+------------+
| topic                                  | partitions |
+----------------------------------------+------------+
| stall1.agent.approvals                 | {0-5}      |
| stall1.agent.events                    | {0,2}      |
+----------------------------------------+------------+ for group stall1.keylane"""


def test_a_table_becomes_its_rows_on_the_line_of_its_message() -> None:
    assert tables_on_one_line(ASSIGNED) == (
        "[2026-12-02 08:47:33,696] [14186] [INFO] Setting newly assigned partitions Topic Partition Set: "
        "stall1.agent.approvals {0-5}, stall1.agent.events {0,2} for group stall1.keylane"
    )
    assert tables_on_one_line("no table here\n  an indented second line") == (
        "no table here\n  an indented second line"
    )


def test_the_worker_logs_what_faust_renders_as_a_table_on_one_line(tmp_path: object) -> None:
    app = build_app(Settings.from_env({}, data_dir=tmp_path), load_catalog())
    worker = Worker(app, loglevel="INFO", redirect_stdouts=False)
    root = logging.getLogger()
    before = (root.level, list(root.handlers))
    try:
        worker._setup_logging()  # Faust's own set-up, then the worker's one-line formatter
        (installed,) = [h for h in root.handlers if h not in before[1]]
        assert installed.formatter is not None
        record = logging.LogRecord(
            "aiokafka",
            logging.INFO,
            __file__,
            1,
            "Setting newly assigned partitions %s for group g",
            ({TP("t.agent.events", 0), TP("t.agent.events", 1), TP("t.agent.results", 3)},),
            None,
        )
        line = installed.formatter.format(record)
    finally:
        root.setLevel(before[0])
        for handler in [h for h in root.handlers if h not in before[1]]:
            root.removeHandler(handler)

    assert "\n" not in line
    assert line.endswith(
        "Setting newly assigned partitions Topic Partition Set: t.agent.events {0-1}, t.agent.results {3} "
        "for group g"
    )
