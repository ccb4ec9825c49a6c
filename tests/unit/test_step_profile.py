"""bench.step_profile's timers: a phase is timed only while enabled, and the kernels keep every other call."""

from types import SimpleNamespace

from bench.step_profile import PhaseTimes, _TimedKernels


def test_a_wrapped_phase_adds_its_time_only_while_enabled_and_returns_what_it_wrapped() -> None:
    times = PhaseTimes()
    doubled = times.wrap("double", lambda value: value * 2)
    assert doubled(2) == 4 and "double" not in times.seconds
    times.enabled = True
    assert doubled(3) == 6 and times.seconds["double"] > 0


def test_only_decode_attention_is_timed_in_the_kernels() -> None:
    times = PhaseTimes()
    times.enabled = True
    kernels = SimpleNamespace(decode_attention=lambda *args: "attended", rms_norm=lambda: "normed")
    timed = _TimedKernels(kernels, times)
    assert timed.decode_attention(1, 2) == "attended" and timed.rms_norm() == "normed"
    assert set(times.seconds) == {"attention"}
