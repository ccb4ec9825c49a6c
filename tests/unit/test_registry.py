"""Served names: which worker, and so which canonical model, a requested name means."""

from __future__ import annotations

from shared.registry import WorkerInfo, served_names, serving


def _info(worker_id: str, model: str, *aliases: str, draining: bool = False) -> WorkerInfo:
    return WorkerInfo(
        worker_id=worker_id, model=model, aliases=aliases, max_model_len=128, started_at=1.0,
        draining=draining,
    )  # fmt: skip


def test_an_alias_resolves_to_its_model_and_the_model_to_itself() -> None:
    workers = [_info("a", "primary", "alias"), _info("b", "other")]

    assert [serving(name, workers) for name in ("primary", "alias", "other")] == [
        workers[0], workers[0], workers[1]
    ]  # fmt: skip
    assert serving("absent", workers) is None


def test_a_model_s_own_name_wins_over_another_model_s_alias() -> None:
    workers = [_info("a", "x", "shared"), _info("b", "shared")]

    found = serving("shared", workers)

    assert found is not None and found.model == "shared"


def test_draining_workers_resolve_nothing() -> None:
    assert serving("alias", [_info("a", "primary", "alias", draining=True)]) is None


def test_served_names_lists_every_name_once_sorted() -> None:
    workers = [_info("a", "primary", "alias"), _info("b", "primary", "alias"), _info("c", "beta")]

    assert served_names(workers) == ["alias", "beta", "primary"]


def test_a_record_without_aliases_still_parses() -> None:
    record = '{"worker_id": "a", "model": "m", "max_model_len": 128, "started_at": 1.0}'

    assert WorkerInfo.model_validate_json(record).served_names == ("m",)
