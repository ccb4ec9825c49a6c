"""Log lines: JSON objects with the request id and the process, or readable text."""

from __future__ import annotations

import json
import logging

from shared.logs import JsonFormatter, RequestIdFilter, request_context


def _record(message: str, *args: object) -> logging.LogRecord:
    record = logging.LogRecord("worker.queue.jobs", logging.INFO, __file__, 1, message, args, None)
    RequestIdFilter().filter(record)
    return record


def test_a_json_line_carries_the_request_id_and_process_fields() -> None:
    with request_context("req-123"):
        record = _record("finished %s", "stop")
    line = json.loads(JsonFormatter({"process": "worker", "worker_id": "w1"}).format(record))
    assert line == {
        "ts": line["ts"],
        "level": "INFO",
        "logger": "worker.queue.jobs",
        "message": "finished stop",
        "request_id": "req-123",
        "process": "worker",
        "worker_id": "w1",
        "host": line["host"],
        "pid": record.process,
    }


def test_a_json_line_outside_a_request_has_a_null_request_id() -> None:
    line = json.loads(JsonFormatter({"process": "gateway"}).format(_record("ready")))
    assert line["request_id"] is None
    assert line["process"] == "gateway"
