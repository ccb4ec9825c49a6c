"""The arq keys ``shared/keys.py`` spells are arq's own (the enqueue and claim scripts reproduce them)."""

from __future__ import annotations

from arq import constants

from shared import keys


def test_arq_key_names_equal_arqs_constants() -> None:
    ours = {
        "job": keys.ARQ_JOB_PREFIX,
        "in-progress": keys.ARQ_IN_PROGRESS_PREFIX,
        "retry": keys.ARQ_RETRY_PREFIX,
        "result": keys.ARQ_RESULT_PREFIX,
        "abort": keys.ARQ_ABORTS,
    }
    assert ours == {
        "job": constants.job_key_prefix,
        "in-progress": constants.in_progress_key_prefix,
        "retry": constants.retry_key_prefix,
        "result": constants.result_key_prefix,
        "abort": constants.abort_jobs_ss,
    }
