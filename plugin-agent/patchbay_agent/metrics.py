"""Prometheus metrics, written in the text exposition format by the agent itself.

The agent runs on every node, so its memory is multiplied by the cluster's size. The agent process
in its pod on the real node holds 40.3 MiB RSS (34.7 MiB PSS; docs/benchmarks.md), and
prometheus-client would add 2.5-3.1 MiB and a thread to that (docs/facts.md#client-memory). The
text format for a few counters and gauges and two histograms is a few lines, so the agent writes
it itself: format 0.0.4, what every Prometheus scrapes. The tests read it back with
prometheus-client's own parser: tests/sockets/test_agent_metrics.py (the agent's real /metrics)
and tests/unit/agent/test_agent_metrics_format.py (escaping, special values, refused names).

Metric and label names are checked when a metric is declared, so a bad name fails the agent's
start, not a scrape. `httpserver.HttpEndpoint` serves `Registry.render()` on /metrics.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import resource
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Generic, TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: When this process started (wall clock), for process_start_time_seconds.
_START = time.time()

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: Label names the format gives a meaning of its own (histogram buckets, summary quantiles).
_RESERVED_LABELS = frozenset({"le", "quantile"})

# Allocate sits on pod admission; buckets resolve the sub-millisecond range it should live in.
_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)
_ROUND_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)
# DRA prepare reads each claim from the API server (milliseconds) and writes a CDI spec.
_DRA_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    pairs = (f'{n}="{_escape_label_value(v)}"' for n, v in zip(names, values, strict=True))
    return "{" + ",".join(pairs) + "}"


class _Metric:
    """What every metric family has: a checked name, HELP and TYPE lines, a place in a registry."""

    kind = "untyped"

    def __init__(self, registry: Registry, name: str, doc: str, labelnames: Sequence[str] = ()) -> None:
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__") or label in _RESERVED_LABELS:
                raise ValueError(f"{name}: invalid label name {label!r}")
        if len(set(labelnames)) != len(labelnames):
            raise ValueError(f"{name}: duplicate label names {labelnames}")
        self.name = name
        self.doc = doc
        self.labelnames = tuple(labelnames)
        registry.add(self)

    @property
    def sample_names(self) -> tuple[str, ...]:
        """The names its sample lines use (a histogram's differ from the family's)."""
        return (self.name,)

    def render(self) -> list[str]:
        return [
            f"# HELP {self.name} {_escape_help(self.doc)}",
            f"# TYPE {self.name} {self.kind}",
            *self._samples(),
        ]

    def _samples(self) -> Iterator[str]:
        raise NotImplementedError


class _CounterValue:
    """One labelled series of a counter: it only goes up."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self.value += amount


class _GaugeValue:
    """One labelled series of a gauge."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


_V = TypeVar("_V", _CounterValue, _GaugeValue)


class _Family(_Metric, Generic[_V]):
    """A counter or gauge: one series per combination of label values (one, without labels)."""

    _series_type: type[_V]

    def __init__(self, registry: Registry, name: str, doc: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(registry, name, doc, labelnames)
        self._series: dict[tuple[str, ...], _V] = {}
        if not self.labelnames:
            self._series[()] = self._series_type()

    def labels(self, *values: str) -> _V:
        series = self._series.get(values)
        if series is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}")
            series = self._series[values] = self._series_type()
        return series

    def remove(self, *values: str) -> None:
        """Drop one series (a device or a pod that is gone); no error when it is not there."""
        if self.labelnames:
            self._series.pop(values, None)

    def clear(self) -> None:
        """Drop every series, the label-less one too: a figure not known yet is left out of the
        text rather than written as 0 (the next `set` brings it back)."""
        self._series.clear()

    def label_values(self) -> list[tuple[str, ...]]:
        """The label values of every series there is."""
        return list(self._series)

    def _samples(self) -> Iterator[str]:
        for values, series in sorted(self._series.items()):
            yield f"{self.name}{_labels(self.labelnames, values)} {_fmt(series.value)}"


class Counter(_Family[_CounterValue]):
    kind = "counter"
    _series_type = _CounterValue

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)


class Gauge(_Family[_GaugeValue]):
    kind = "gauge"
    _series_type = _GaugeValue

    def set(self, value: float) -> None:
        self.labels().set(value)

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self.labels().dec(amount)


class Histogram(_Metric):
    """Observations counted into buckets (no labels). `counts[i]` holds the observations in
    (bounds[i-1], bounds[i]]; the rendering makes them cumulative, as the format wants."""

    kind = "histogram"

    def __init__(self, registry: Registry, name: str, doc: str, buckets: Sequence[float]) -> None:
        bounds = sorted(buckets)
        if not bounds or len(set(bounds)) != len(bounds) or not all(math.isfinite(b) for b in bounds):
            raise ValueError(f"{name}: buckets must be distinct finite numbers, got {buckets}")
        super().__init__(registry, name, doc)
        self.bounds = (*bounds, math.inf)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0

    @property
    def sample_names(self) -> tuple[str, ...]:
        return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")

    def observe(self, value: float) -> None:
        self.sum += value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break

    def _samples(self) -> Iterator[str]:
        cumulative = 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            cumulative += count
            yield f"{self.name}_bucket{_labels(('le',), (_fmt(bound),))} {cumulative}"
        yield f"{self.name}_sum {_fmt(self.sum)}"
        yield f"{self.name}_count {cumulative}"


class Registry:
    def __init__(self) -> None:
        self.families: list[_Metric] = []
        self._names: set[str] = set()

    def add(self, metric: _Metric) -> None:
        """Register a family; refuses one whose family or sample names another already uses."""
        names = {metric.name, *metric.sample_names}
        if names & self._names:
            raise ValueError(f"metric {metric.name} collides with {sorted(names & self._names)}")
        self._names |= names
        self.families.append(metric)

    def render(self) -> bytes:
        lines = [line for family in self.families for line in family.render()]
        return ("\n".join(lines) + "\n").encode()


def process_metrics() -> bytes:
    """The standard process metrics Prometheus client libraries export (the names its dashboards
    and ours use: `process_resident_memory_bytes` in the chart's "Agent RSS" panel), read from
    /proc/self: one set per process, appended once to /metrics whatever the registry."""
    lines: list[str] = []

    def gauge(name: str, doc: str, value: float, kind: str = "gauge") -> None:
        lines.extend((f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name} {_fmt(value)}"))

    try:
        with open("/proc/self/statm") as f:
            rss_pages = int(f.read().split()[1])
        gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            rss_pages * os.sysconf("SC_PAGE_SIZE"),
        )
    except (OSError, ValueError, IndexError):
        pass
    usage = resource.getrusage(resource.RUSAGE_SELF)
    gauge(
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
        usage.ru_utime + usage.ru_stime,
        "counter",
    )
    gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", _START)
    with contextlib.suppress(OSError):
        gauge("process_open_fds", "Number of open file descriptors.", len(os.listdir("/proc/self/fd")))
    return ("\n".join(lines) + "\n").encode()


def _with_label(line: str, name: str, value: str) -> str:
    """A sample line with one more label, first: `m{a="b"} 1` -> `m{name="value",a="b"} 1`."""
    pair = f'{name}="{_escape_label_value(value)}"'
    metric, sep, rest = line.partition(" ")
    if metric.endswith("}"):
        head, _, labels = metric.partition("{")
        return f"{head}{{{pair},{labels}{sep}{rest}"
    return f"{metric}{{{pair}}}{sep}{rest}"


class MergedRegistry:
    """The registries of several profiles' agents in one process as one exposition: each family's
    HELP and TYPE once, then every part's samples with a `profile` label (the node agent's
    /metrics; docs/agent.md)."""

    def __init__(self, parts: Callable[[], Sequence[tuple[str, Registry]]]) -> None:
        self._parts = parts

    def render(self) -> bytes:
        heads: dict[str, list[str]] = {}
        samples: dict[str, list[str]] = {}
        for profile, registry in self._parts():
            for family in registry.families:
                lines = family.render()
                heads.setdefault(family.name, lines[:2])
                samples.setdefault(family.name, []).extend(
                    _with_label(line, "profile", profile) for line in lines[2:]
                )
        out = [line for name, head in heads.items() for line in (*head, *samples[name])]
        return ("\n".join(out) + "\n").encode()


class Metrics:
    """Every metric the agent exports; one instance (and registry) per agent."""

    def __init__(self, resource_name: str, node_name: str, *, holder_labels: bool = False) -> None:
        """`holder_labels`: one `allocated_devices` series per holding container, labelled with
        its namespace, pod and container (`--metrics-holder-labels`); off, one series, the total.
        Off by default: the port is open to the pod network, and pod names are not everyone's to
        read (docs/security.md#the-agents-http-port)."""
        r = self.registry = Registry()
        info = Gauge(
            r,
            "patchbay_agent_info",
            "Constant 1, labelled with what this agent serves.",
            ["resource", "node"],
        )
        info.labels(resource_name, node_name).set(1)
        self.devices = Gauge(
            r, "patchbay_agent_devices", "Advertised devices (replicas included) by health.", ["health"]
        )
        self.physical_devices = Gauge(r, "patchbay_agent_physical_devices", "Physical devices discovered.")
        self.registered = Gauge(r, "patchbay_agent_registered", "1 while registered with the kubelet.")
        self.registrations = Counter(
            r, "patchbay_agent_registrations_total", "Register calls by result.", ["result"]
        )
        self.rpcs = Counter(
            r, "patchbay_agent_rpcs_total", "DevicePlugin calls by method and gRPC code.", ["method", "code"]
        )
        self.allocate_seconds = Histogram(
            r,
            "patchbay_agent_allocate_seconds",
            "Allocate handling time, calls answered OK.",
            _LATENCY_BUCKETS,
        )
        self.streams = Gauge(r, "patchbay_agent_list_and_watch_streams", "Open ListAndWatch streams.")
        self.round_seconds = Histogram(
            r, "patchbay_agent_health_round_seconds", "Discovery + health round duration.", _ROUND_BUCKETS
        )
        self.list_bytes = Gauge(
            r, "patchbay_agent_list_and_watch_bytes", "Encoded size of the advertised list."
        )
        self.list_too_large = Counter(
            r, "patchbay_agent_list_too_large_total", "Device lists not published because they exceed 4 MiB."
        )
        self.device_healthy = Gauge(
            r,
            "patchbay_agent_device_healthy",
            "1 while a physical device is Healthy, 0 while Unhealthy; one series per listed device.",
            ["device"],
        )
        self.holder_labels = holder_labels
        self.allocated_devices = Gauge(
            r,
            "patchbay_agent_allocated_devices",
            "Device IDs of this resource (replicas counted one by one) the kubelet allocated to "
            "containers, from its PodResources API: the total, or with --metrics-holder-labels one "
            "series per container holding any (labels holder_namespace, holder_pod, holder_container).",
            ["holder_namespace", "holder_pod", "holder_container"] if holder_labels else [],
        )
        if not holder_labels:
            self.allocated_devices.clear()  # unknown until the first PodResources read
        self.pod_resources_reads = Counter(
            r,
            "patchbay_agent_pod_resources_reads_total",
            "Reads of the kubelet's PodResources List, by result (only while reports are on).",
            ["result"],
        )
        self.report_writes = Counter(
            r,
            "patchbay_agent_report_writes_total",
            "DeviceReport writes (server-side apply) by result.",
            ["result"],
        )
        self.report_restores = Counter(
            r,
            "patchbay_agent_report_restores_total",
            "Times the agent found its DeviceReport deleted or written by someone else, and wrote it again.",
        )
        self.repairs = Counter(
            r,
            "patchbay_agent_repairs_total",
            "Objects the agent writes (kind DeviceReport or ResourceSlice) that someone else deleted "
            "or edited (cause) and the agent wrote again, as its watch saw it.",
            ["kind", "cause"],
        )
        for kind in ("DeviceReport", "ResourceSlice"):
            for cause in ("deleted", "edited"):
                self.repairs.labels(kind, cause)  # 0 from the start: rate() needs a first sample
        self.slice_writes = Counter(
            r,
            "patchbay_agent_resource_slice_writes_total",
            "DRA mode: ResourceSlice pool writes (server-side apply of every slice) by result.",
            ["result"],
        )
        self.claim_errors = Counter(
            r,
            "patchbay_agent_dra_claim_errors_total",
            "DRA mode: claims a NodePrepareResources or NodeUnprepareResources call answered with an "
            "error, by method.",
            ["method"],
        )
        self.claim_status_writes = Counter(
            r,
            "patchbay_agent_dra_claim_status_writes_total",
            "DRA mode: writes of prepared devices into ResourceClaims' status.devices, by result "
            "(success, gone, refused, error).",
            ["result"],
        )
        self.dra_prepare_seconds = Histogram(
            r,
            "patchbay_agent_dra_prepare_seconds",
            "DRA mode: NodePrepareResources handling time per call (all its claims, read in parallel).",
            _DRA_BUCKETS,
        )
        self.dra_claim_read_seconds = Histogram(
            r,
            "patchbay_agent_dra_claim_read_seconds",
            "DRA mode: the GET of one ResourceClaim during NodePrepareResources, as prepare waits for "
            "it (the API server's answer and the hop to the worker thread).",
            _DRA_BUCKETS,
        )
        self.dra_cdi_write_seconds = Histogram(
            r,
            "patchbay_agent_dra_cdi_write_seconds",
            "DRA mode: writing one claim's CDI spec file during NodePrepareResources (on the event loop).",
            _DRA_BUCKETS,
        )
        self.dra_unprepare_seconds = Histogram(
            r,
            "patchbay_agent_dra_unprepare_seconds",
            "DRA mode: NodeUnprepareResources handling time per call.",
            _DRA_BUCKETS,
        )
        self.report_unchanged = Counter(
            r,
            "patchbay_agent_report_unchanged_total",
            "DeviceReports built and not written because they equal the last one written.",
        )

    def observe_round(
        self, seconds: float, devices: Mapping[str, bool], advertised: int, healthy: int
    ) -> None:
        """One discovery/health round: `devices` physical ID -> healthy; `advertised` and
        `healthy` count advertised IDs (replicas)."""
        self.round_seconds.observe(seconds)
        self.devices.labels("Healthy").set(healthy)
        self.devices.labels("Unhealthy").set(advertised - healthy)
        self.physical_devices.set(len(devices))
        for (device,) in self.device_healthy.label_values():
            if device not in devices:
                self.device_healthy.remove(device)
        for device, ok in devices.items():
            self.device_healthy.labels(device).set(1 if ok else 0)

    def set_allocations(self, counts: Mapping[tuple[str, str, str], int]) -> None:
        """Per-container allocated device counts, keyed (namespace, pod, container); the series of
        containers no longer holding devices go. Without holder labels: their sum."""
        if not self.holder_labels:
            self.allocated_devices.set(sum(counts.values()))
            return
        for key in self.allocated_devices.label_values():
            if key not in counts:
                self.allocated_devices.remove(*key)
        for (namespace, pod, container), n in counts.items():
            self.allocated_devices.labels(namespace, pod, container).set(n)
