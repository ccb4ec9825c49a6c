"""Reading Prometheus text the way a scraper does: prometheus_client's own parser, then sample lookups."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


@dataclass(frozen=True)
class Scrape:
    """One parsed exposition: metric families by name (``_total`` dropped from counters)."""

    families: dict[str, tuple[str, list[Sample]]]  # name -> (type, samples)

    @classmethod
    def parse(cls, text: str) -> Scrape:
        return cls(
            {
                family.name: (family.type, list(family.samples))
                for family in text_string_to_metric_families(text)
            }
        )

    def type_of(self, family: str) -> str:
        return self.families[family][0]

    def value(self, sample_name: str, **labels: str) -> float:
        """The sum of the samples called ``sample_name`` whose labels include ``labels`` (0 if none)."""
        family = self._family_of(sample_name)
        if family is None:
            return 0.0
        return sum(
            sample.value
            for sample in self.families[family][1]
            if sample.name == sample_name and labels.items() <= sample.labels.items()
        )

    def labels_of(self, sample_name: str) -> list[dict[str, str]]:
        family = self._family_of(sample_name)
        if family is None:
            return []
        return [sample.labels for sample in self.families[family][1] if sample.name == sample_name]

    def _family_of(self, sample_name: str) -> str | None:
        for suffix in ("_total", "_count", "_sum", "_bucket", "_created", ""):
            name = sample_name.removesuffix(suffix) if suffix else sample_name
            if name in self.families:
                return name
        return None
