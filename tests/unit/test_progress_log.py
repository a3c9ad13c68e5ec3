"""Long start-up work (a cold ``--compile``) logs that it is alive and how long it took."""

from __future__ import annotations

import logging
import time

import pytest

from speclane.engine.engine import _progress_log


def test_progress_log_reports_while_running_and_when_done(caplog):
    with caplog.at_level(logging.INFO, logger="speclane.engine.engine"), _progress_log("compiling", every_s=0.05):
        time.sleep(0.3)
    messages = [r.getMessage() for r in caplog.records]
    alive = [m for m in messages if m.startswith("compiling:") and "so far" in m]
    assert len(alive) >= 2, messages
    assert messages[-1].startswith("compiling: done in ")


def test_progress_log_stops_reporting_after_the_block(caplog):
    with caplog.at_level(logging.INFO, logger="speclane.engine.engine"):
        with _progress_log("quick", every_s=0.05):
            time.sleep(0.12)
        ended = len(caplog.records)
        time.sleep(0.2)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == ended  # nothing after the block ended
    assert messages[-1].startswith("quick: done in ")


def test_progress_log_says_when_the_work_failed(caplog):
    with (caplog.at_level(logging.INFO, logger="speclane.engine.engine"), pytest.raises(RuntimeError),
          _progress_log("compiling", every_s=1.0)):
        raise RuntimeError("inductor failed")
    messages = [r.getMessage() for r in caplog.records]
    assert messages[-1].startswith("compiling: failed after ") and not any("done" in m for m in messages)
