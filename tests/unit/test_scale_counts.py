"""The scale bench's arithmetic: latency percentiles, Redis counter deltas, frames the client counts."""

from __future__ import annotations

from bench.scale.counts import (
    RedisCounters,
    counter_delta,
    histogram_percentile,
    merge_histograms,
    parse_counters,
    per,
)
from bench.scale.load import CONTENT_FRAME


def test_percentiles_of_a_histogram_are_the_bins_that_reach_the_share() -> None:
    histogram = {1: 50, 2: 40, 10: 9, 250: 1}

    assert histogram_percentile(histogram, 50) == 1
    assert histogram_percentile(histogram, 51) == 2
    assert histogram_percentile(histogram, 99) == 10
    assert histogram_percentile(histogram, 100) == 250
    assert histogram_percentile({}, 50) is None


def test_histograms_from_json_merge_by_bin() -> None:
    merged = merge_histograms([{"1": 2, "3": 1}, {1: 1, "7": 4}])

    assert merged == {1: 3, 3: 1, 7: 4}


def test_counter_deltas_keep_only_commands_called_in_between() -> None:
    before = parse_counters(
        {"total_commands_processed": 100, "total_reads_processed": 40},
        {"used_cpu_user": 1.5, "used_cpu_sys": 0.5},
        {"cmdstat_xadd": {"calls": 10, "usec": 5}, "cmdstat_ping": {"calls": 3, "usec": 1}},
    )
    after = RedisCounters(commands=160, reads=50, cpu_s=2.5, calls={"xadd": 60, "ping": 3, "evalsha": 5})

    delta = counter_delta(before, after)

    assert (delta.commands, delta.reads, delta.cpu_s) == (60, 10, 0.5)
    assert delta.calls == {"xadd": 50, "evalsha": 5}


def test_ratios_with_nothing_to_divide_by_are_none() -> None:
    assert per(10, 4) == 2.5
    assert per(10, 0) is None


def test_the_load_client_counts_content_frames_by_their_entry_ids_through_http_chunks() -> None:
    def frame(entry_id: str, delta: str) -> bytes:
        data = f'{{"choices":[{{"index":0,"delta":{delta}}}]}}'
        body = f"id: {entry_id}\ndata: {data}\n\n".encode()
        return f"{len(body):x}\r\n".encode() + body + b"\r\n"

    stream = (
        frame("100-0", '{"role":"assistant","content":""}')
        + frame("105-0", '{"content":"t"}')
        + frame("105-1", '{"content":"h"}')
        + frame("109-0", "{}")
    )

    assert CONTENT_FRAME.findall(stream) == [b"105", b"105"]
