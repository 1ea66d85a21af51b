"""Writes bench-report.md and its plots from one run's results."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench import names
from bench.gate import evaluate
from bench.harness import SPREAD_LIMIT, Result
from bench.lanes import IDEAL_SHARE_OF_E2E
from bench.runtime_baseline import RUNTIME_VS_BASELINE
from bench.targets import TARGETS, e2e_to_peer, rate_of, ratio_of, sample_figure

RECOVERY_PREFIX = "recovery_"  # bench/recovery.py's result names: recovery_<N>keys


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def spread_cell(result: Result) -> str:
    """The repetitions' spread around their median, flagged past SPREAD_LIMIT."""
    measured = result.spread
    if measured is None:
        return f"— ({len(result.repetitions) or 1} run)"
    flag = " ⚠" if result.unstable else ""
    return f"{measured:.0%}{flag} ({len(result.repetitions)} runs)"


def summary_table(results: dict[str, Result]) -> list[str]:
    lines = [
        "| benchmark | unit | median | p50 | p99 | samples | rate (/s) | spread | ratio to peers |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name in names.EXPECTED:
        result = results.get(name)
        if result is None:
            lines.append(f"| {name} | — | missing | | | | | | |")
            continue
        s = result.summary()
        peers = ""
        if name == names.E2E_NOOP:
            peers = (
                f"{_fmt(e2e_to_peer(results, 'aiokafka'), 2)}x raw aiokafka loop, "
                f"{_fmt(e2e_to_peer(results, 'faust'), 2)}x plain Faust + table"
            )
        lines.append(
            f"| {name} | {result.unit} | {_fmt(s.get('median'))} | {_fmt(s.get('p50'))} "
            f"| {_fmt(s.get('p99'))} "
            f"| {s['n'] or '—'} | {_fmt(result.rate, 1)} | {spread_cell(result)} | {peers} |"
        )
    return lines


def unstable_figures(results: dict[str, Result]) -> list[str]:
    """One line naming the figures whose repetitions disagree by more than SPREAD_LIMIT."""
    unstable = [name for name in names.EXPECTED if name in results and results[name].unstable]
    if not unstable:
        return [f"Every repeated figure's repetitions lie within {SPREAD_LIMIT:.0%} of their median."]
    shown = ", ".join(f"`{name}` ({results[name].spread:.0%})" for name in unstable)
    return [
        f"⚠ Repetitions spread more than {SPREAD_LIMIT:.0%} of their median for {shown}: "
        "the machine was not steady enough for these figures; do not compare them."
    ]


def targets_table(results: dict[str, Result]) -> list[str]:
    lines = ["| target | goal | measured | status |", "| --- | --- | ---: | --- |"]
    for target in TARGETS:
        measured, status = target.verdict(results)
        lines.append(f"| {target.label} | {target.goal} | {_fmt(measured, 2)} | {status} |")
    return lines


def baseline_table(results: dict[str, Result]) -> list[str]:
    """The baseline commit's keylane beside this tree's, round by round (bench/runtime_baseline.py)."""
    result = results.get(RUNTIME_VS_BASELINE)
    if result is None:
        return ["_not measured_"]
    extra = result.extra
    commit = str(extra.get("baseline_commit", ""))[:12]
    if "unavailable" in extra:
        why = extra["unavailable"]
        return [f"_baseline commit {commit} not measured: {why}; the targets use bench/baseline.json_"]
    rows = [
        "| round | own cost, baseline (ms) | own cost, now (ms) | suspension p50, baseline (ms) | "
        "suspension p50, now (ms) |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for index, (then, now) in enumerate(zip(extra["baseline"], extra["current"], strict=True), start=1):
        suspension = (then["suspension_roundtrip_p50_ms"], now["suspension_roundtrip_p50_ms"])
        rows.append(
            f"| {index} | {_fmt(then['own_cost_ms'])} | {_fmt(now['own_cost_ms'])} | "
            f"{_fmt(suspension[0], 4)} | {_fmt(suspension[1], 4)} |"
        )
    rows += [
        "",
        f"Baseline: keylane at {commit}, under this tree's harness, in a subprocess taking turns "
        f"with this tree's, a chunk at a time; each side's own cost is its overhead_50 p50 less its own "
        f"timer_baseline p50, the two measured in turns. Median ratios over the rounds: own cost "
        f"{_fmt(extra.get('own_cost_ratio'))}, suspension round trip {_fmt(extra.get('suspension_ratio'))}.",
    ]
    return rows


def throughput_math(results: dict[str, Result]) -> list[str]:
    noop = rate_of(results, names.NOOP_1KEY)
    o50, o500, o2000 = (sample_figure(results, names.OVERHEAD[t], "p50") for t in names.OVERHEAD_TIERS_MS)
    baseline = sample_figure(results, names.TIMER_BASELINE, "p50")
    suspend = sample_figure(results, names.SUSPENSION_ROUNDTRIP, "p50")
    commits = ", ".join(
        f"{kib} KiB: {_fmt(sample_figure(results, names.STATE_COMMIT[kib]))} ms"
        for kib in names.STATE_SIZES_KIB
    )
    lines = [
        "| input | where it comes from | measured |",
        "| --- | --- | --- |",
        f"| runtime ceiling, zero agent work | `noop_throughput` | {_fmt(noop, 0)} activations/s "
        f"({_fmt(1000 / noop if noop else None)} ms each) |",
        f"| runtime overhead per activation | `overhead_50ms` (gated), `overhead_500ms`, `overhead_2000ms` "
        f"| p50 {_fmt(o50)} / {_fmt(o500)} / {_fmt(o2000)} ms "
        f"(event-loop timer baseline {_fmt(baseline)} ms) |",
        f"| suspension round-trip cost | `suspension_roundtrip` "
        f"| p50 {_fmt(suspend)} ms for start + resume |",
        f"| cost of carrying memory | `state_commit_{{1,16,64,100}}kib` | p50 {commits} |",
    ]
    if o50 is not None:
        per_key = 1000 / (50 + o50)
        lines += [
            "",
            f"Worked example on the 50 ms tier: E[activation_ms] ≈ 50 + {o50:.2f}, so one key sustains about "
            f"1000 / {50 + o50:.2f} ≈ {per_key:.1f} activations/s; an entity at 60 events/s needs "
            f"N ≥ {60 / per_key:.1f} shards. At the 2000 ms tier one key sustains about "
            f"{1000 / (2000 + (o2000 or 0)):.2f} activations/s.",
        ]
    ceiling = results.get(names.PER_KEY_CEILING)
    if ceiling is not None and ceiling.rate is not None:
        bound = ceiling.extra.get("bound_rate")
        lines += [
            "",
            f"Through the broker, one hot key at 50 ms reached {ceiling.rate:.1f} activations/s "
            "against the bound "
            f"1000 / E[activation_ms] = {_fmt(bound, 1)} (E[activation_ms] = "
            f"{_fmt(ceiling.extra.get('mean_activation_ms'), 2)} ms from the worker's own histogram).",
        ]
    return lines


def _table(
    header: str, rows: Iterable[tuple[str, Result | None]], render: Callable[[str, Result], str]
) -> list[str]:
    """A right-aligned markdown table under ``header``: one row per (label, result), rendered
    by ``render`` when the run measured it and marked missing when it did not."""
    columns = header.count("|") - 1
    lines = [header, "|" + " ---: |" * columns]
    for label, result in rows:
        lines.append(
            render(label, result) if result is not None else f"| {label} | missing |" + " |" * (columns - 2)
        )
    return lines


def fanout_table(results: dict[str, Result]) -> list[str]:
    base = rate_of(results, names.HOT_KEY_FANOUT[1])

    def render(n: str, result: Result) -> str:
        spread = result.extra.get("spread", {})
        partitions = result.extra.get("partitions", {})
        return (
            f"| {n} | {_fmt(result.rate, 1)} | {_fmt(ratio_of(result.rate, base), 2)} | {n} "
            f"| {_fmt(result.extra.get('ideal_ratio'), 2)} | "
            f"{', '.join(f'{k}: {v}' for k, v in sorted(spread.items()))} | "
            f"{', '.join(f'{k}: p{v}' for k, v in sorted(partitions.items()))} |"
        )

    return _table(
        "| N | rate (/s) | ratio to N=1 | ideal | ideal this spread allows | outputs per physical key "
        "| partition of each shard |",
        ((str(n), results.get(names.HOT_KEY_FANOUT[n])) for n in names.FANOUT_SHARDS),
        render,
    )


def lanes_table(results: dict[str, Result]) -> list[str]:
    def render(mode: str, result: Result) -> str:
        extra = result.extra
        return (
            f"| {mode} | {extra.get('keys')} | {extra.get('max_in_flight') if mode == 'key' else '1 lane'} "
            f"| {_fmt(result.rate, 1)} | {_fmt(extra.get('ideal_rate'), 1)} "
            f"| {_fmt(extra.get('ideal_at_default_in_flight'), 1)} "
            f"| {_fmt(extra.get('ratio_to_ideal'), 2)} | {_fmt(extra.get('min_ratio_to_ideal'), 2)} |"
        )

    lines = _table(
        "| lanes | keys on partition 0 | max_in_flight | rate (/s) | ideal (/s) | ideal at 64 in flight (/s) "
        "| ratio to ideal | worst repetition |",
        ((mode, results.get(name)) for mode, name in names.LANES.items()),
        render,
    )
    carried = rate_of(results, names.E2E_NOOP)
    if carried is not None:
        lines += [
            "",
            f"The worker's whole path carried {carried:,.0f} records/s with a no-op agent in this run "
            "(`e2e_noop`). Key lanes ran with the largest max_in_flight up to 64 whose ideal stays within "
            f"{IDEAL_SHARE_OF_E2E:.0%} of that (bench/lanes.py): an ideal above it measures the path, "
            "not the lanes.",
        ]
    return lines


def state_growth_table(results: dict[str, Result]) -> list[str]:
    base = rate_of(results, names.STATE_GROWTH[names.STATE_GROWTH_KIB[0]])

    def render(label: str, result: Result) -> str:
        x = result.extra
        written, changed = x.get("changelog_bytes_per_activation"), x.get("changed_bytes_per_activation")
        return (
            f"| {label} | {_fmt(result.rate, 1)} | {_fmt(ratio_of(result.rate, base), 2)} "
            f"| {_fmt(written / 1024 if written is not None else None, 1)} KiB "
            f"| {_fmt(changed / 1024 if changed is not None else None, 1)} KiB "
            f"| {_fmt(x.get('write_amplification'), 1)}x | {spread_cell(result)} |"
        )

    return _table(
        "| memory per key | activations/s | ratio to 1 KiB | changelog per activation "
        "| changed per activation | write amplification | spread |",
        ((f"{kib} KiB", results.get(names.STATE_GROWTH[kib])) for kib in names.STATE_GROWTH_KIB),
        render,
    )


def _mib(value: Any) -> str:
    return "—" if not isinstance(value, int | float) else f"{value / 2**20:,.1f} MiB"


def _count(value: Any) -> str:
    return "—" if not isinstance(value, int) else f"{value:,}"


def recovery_results(results: dict[str, Result]) -> list[Result]:
    """The recovery_<N>keys results (bench/recovery.py), smallest first."""
    found = [r for name, r in results.items() if name.startswith(RECOVERY_PREFIX)]
    return sorted(found, key=lambda r: int(r.extra.get("keys", 0)))


def recovery_table(results: dict[str, Result]) -> list[str]:
    """The Recovery tables of bench/recovery.py, one row per size (times in seconds)."""
    rows = recovery_results(results)
    lines = [
        "| keys | state bytes (changelog) | volume kept (s) | volume lost (s) | kept / lost "
        "| full replay (keys/s) | failover, standby 0 (s) | failover, standby 1 (s) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    details = [
        "| keys | fill (keys/s) | kept: ready / first event / replayed "
        "| lost: ready / first event / replayed (in s) | timer index rebuilt, kept / lost (s) "
        "| B joins empty, s0 / s1 (s) "
        "| standby 0: rebalance / restored / timer index / replayed "
        "| standby 1: rebalance / restored / timer index / replayed |",
        "| ---: | ---: | --- | --- | --- | --- | --- | --- |",
    ]
    if not rows:
        lines.append("| not measured | | | | | | | |")
    for result in rows:
        x = result.extra
        kept, lost = x.get("volume_kept_first_event_s"), x.get("volume_lost_first_event_s")
        lines.append(
            f"| {_count(x.get('keys'))} | {_mib(x.get('changelog_bytes'))} "
            f"({_count(x.get('changelog_records'))} records) | {_fmt(kept, 2)} | {_fmt(lost, 2)} "
            f"| {_fmt(ratio_of(kept, lost), 2)} | {_fmt(result.rate, 0)} "
            f"| {_fmt(x.get('standby0_failover_s'), 2)} | {_fmt(x.get('standby1_failover_s'), 2)} |"
        )
        case = {
            c: f"{_fmt(x.get(f'volume_{c}_ready_s'), 2)} / {_fmt(x.get(f'volume_{c}_first_event_s'), 2)} / "
            f"{_count(x.get(f'volume_{c}_replayed_records'))}"
            for c in ("kept", "lost")
        }
        standby = {
            n: f"{_fmt(x.get(f'standby{n}_rebalance_s'), 2)} / {_fmt(x.get(f'standby{n}_restored_s'), 2)} / "
            f"{_fmt(x.get(f'standby{n}_timer_index_s'), 2)} / "
            f"{_count(x.get(f'standby{n}_failover_replayed_records'))}"
            for n in (0, 1)
        }
        details.append(
            f"| {_count(x.get('keys'))} | {_fmt(x.get('fill_rate'), 0)} | {case['kept']} "
            f"| {case['lost']} ({_fmt(x.get('volume_lost_replay_s'), 2)}) "
            f"| {_fmt(x.get('volume_kept_timer_index_s'), 2)} "
            f"/ {_fmt(x.get('volume_lost_timer_index_s'), 2)} "
            f"| {_fmt(x.get('standby0_join_ready_s'), 2)} / {_fmt(x.get('standby1_join_ready_s'), 2)} "
            f"| {standby[0]} | {standby[1]} |"
        )
    return [*lines, "", *details, *recovery_extrapolation(rows)]


EXTRAPOLATE_TO_KEYS = 100_000


def recovery_extrapolation(rows: list[Result]) -> list[str]:
    """What the largest size measured says about EXTRAPOLATE_TO_KEYS keys, when that size was
    not measured: the fill and the replay scale with the keys at this run's rates, the rest
    (start-up, session timeout, rebalance) does not."""
    if not rows or any(r.extra.get("keys") == EXTRAPOLATE_TO_KEYS for r in rows):
        return []
    x, rate = rows[-1].extra, rows[-1].rate
    keys, fill_rate = x.get("keys"), x.get("fill_rate")
    kept, lost, replay_s = (
        x.get(k) for k in ("volume_kept_first_event_s", "volume_lost_first_event_s", "volume_lost_replay_s")
    )
    rebalance = x.get("standby0_rebalance_s")
    if not (keys and rate and fill_rate and kept and lost and replay_s and rebalance):
        return []
    n = EXTRAPOLATE_TO_KEYS
    base = lost - replay_s  # volume lost minus its replay: start-up, group join, seek
    per_key_bytes = (x.get("changelog_bytes") or 0) / keys
    return [
        "",
        f"Extrapolated to {n:,} keys from the {keys:,}-key row (not measured in this run; "
        f"`BENCH_RECOVERY_KEYS={n}` adds it): changelog ≈ {_mib(per_key_bytes * n)}; "
        f"fill ≈ {n / fill_rate:,.0f} s at "
        f"{fill_rate:,.0f} keys/s; volume lost ≈ {base:,.1f} + {n:,} / {rate:,.0f} "
        f"≈ {base + n / rate:,.0f} s "
        f"(start-up and seek, plus the full replay at the measured rate); volume kept ≈ {kept:,.1f} s "
        f"(no replay; the timer index scan grows with the keys); failover with standby 0 ≈ "
        f"{rebalance:,.1f} + {n // 2:,} / {rate:,.0f} ≈ {rebalance + n / 2 / rate:,.0f} s (the session "
        "timeout, then half the changelog); with standby 1 about the session timeout, as measured.",
    ]


def plots(results: dict[str, Result], out_dir: Path) -> list[str]:
    """PNG plots next to the report; returns their file names (empty without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made = []
    tiers = [
        (t, results[names.OVERHEAD[t]].samples)
        for t in names.OVERHEAD_TIERS_MS
        if names.OVERHEAD[t] in results
    ]
    if tiers:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.boxplot([s for _, s in tiers], showfliers=True)
        ax.set_xticks(range(1, len(tiers) + 1), [f"{t} ms provider" for t, _ in tiers])
        ax.set_ylabel("overhead per activation (ms)")
        ax.set_title("Runtime overhead does not grow with provider latency")
        fig.tight_layout()
        fig.savefig(out_dir / "overhead_tiers.png", dpi=110)
        plt.close(fig)
        made.append("overhead_tiers.png")
    fan = [
        (n, results[names.HOT_KEY_FANOUT[n]].rate)
        for n in names.FANOUT_SHARDS
        if names.HOT_KEY_FANOUT[n] in results
    ]
    if fan and fan[0][1]:
        base = fan[0][1]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([n for n, _ in fan], [(r or 0) / base for _, r in fan], "o-", label="measured")
        ax.plot([n for n, _ in fan], [n for n, _ in fan], "--", label="ideal (N)")
        ax.set_xlabel("shards N")
        ax.set_ylabel("throughput / N=1")
        ax.set_title("Hot-key fan-out (FakeLLM 50 ms)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "fanout_scaling.png", dpi=110)
        plt.close(fig)
        made.append("fanout_scaling.png")
    commits = [
        (k, v)
        for k in names.STATE_SIZES_KIB
        if (v := sample_figure(results, names.STATE_COMMIT[k], "p50")) is not None
    ]
    if len(commits) == len(names.STATE_SIZES_KIB):
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([k for k, _ in commits], [v for _, v in commits], "o-", label="activation + commit (p50)")
        encodes = [
            (k, v)
            for k in names.STATE_SIZES_KIB
            if (v := sample_figure(results, names.ENCODE[k], "p50")) is not None
        ]
        ax.plot([k for k, _ in encodes], [v for _, v in encodes], "s--", label="encode only (p50)")
        ax.set_xlabel("committed memory blob (KiB)")
        ax.set_ylabel("ms")
        ax.set_title("State-commit cost vs blob size")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "state_commit.png", dpi=110)
        plt.close(fig)
        made.append("state_commit.png")
    return made


def write_report(
    results: dict[str, Result], *, size: str, elapsed_s: float, out_dir: Path, path: Path
) -> None:
    """bench-report.md at ``path``; plots go to ``out_dir`` and are linked relative to the report."""
    made = plots(results, out_dir)
    gate = evaluate(results)
    relative = os.path.relpath(out_dir, path.parent)
    lines = [
        "# keylane benchmark report",
        "",
        f"Run: `{size}` size, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {elapsed_s:.0f} s, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}. Written by `make bench` "
        f"(`make bench-quick` for a smoke run); judged by `make bench-gate`.",
        "",
        "Runtime-only benchmarks run in process with FakeLLM and no broker (keylane's own cost); "
        "broker benchmarks run against a real single-node Kafka 3.9 with 6 partitions, next to two "
        "peers measured on the same machine and topics in the same run.",
        "",
        "## Summary",
        "",
        *summary_table(results),
        "",
        "Each benchmark runs several times (`spread` = (max - min) / median of the repetitions' "
        "figures: a rate, or the p50 of a run's samples); the rate is their median and a ratio to "
        "a peer the median of the repetitions' side-by-side ratios.",
        "",
        *unstable_figures(results),
        "",
        "## Targets",
        "",
        *targets_table(results),
        "",
        "## Own cost against the baseline commit, same run",
        "",
        *baseline_table(results),
        "",
        "## Gate",
        "",
        *[f"- {'PASS' if c.passed else 'FAIL'} {c.name}: {c.detail}" for c in gate],
        "",
        "## Throughput-math inputs (seed 000)",
        "",
        *throughput_math(results),
        "",
        "## Hot-key fan-out",
        "",
        *fanout_table(results),
        "",
        "The fan-out runs with the default key lanes: shards that hash to the same partition still run "
        'concurrently. With `lanes="partition"` two such shards would share one serial lane, and the ratio '
        "to N=1 would be bounded by the number of distinct partitions the shards land on, not by N.",
        "",
        "## Key lanes vs partition lanes",
        "",
        *lanes_table(results),
        "",
        "## State cost against what changed",
        "",
        "Keys holding 1, 64 and 512 KiB of memory, each activation rewriting one 1 KiB cell "
        "(bench/state_growth.py). *Changelog per activation*: the state changelog's growth on the "
        "broker (DescribeLogDirs) over a batch, divided by its activations; *write amplification*: "
        "that over the bytes the activation changed. Goals: at most 4x, and 512 KiB at 0.8x the "
        "1 KiB rate or better.",
        "",
        *state_growth_table(results),
        "",
        "## Recovery",
        "",
        "A worker's state after a restart, for keys holding 10 KiB of memory each "
        "(bench/recovery.py). Times in seconds from the worker's launch to the first processed "
        "event on the middle key (its output's timestamp): *volume kept* restarts on the same "
        "KEYLANE_DATA_DIR (RocksDB replays only the changelog tail), *volume lost* on an empty one "
        "(the whole changelog). *Failover* is from `kill -9` of one of two workers to the first "
        "event the survivor processes on the dead worker's partitions; it includes the session "
        "timeout (6 s here), which a crashed worker always costs. *Standby 1* is Faust's default "
        "`table_standby_replicas`: the survivor keeps a copy of the other worker's partitions. "
        "State bytes: the changelog's size on the broker (DescribeLogDirs), before compaction. "
        "Full replay: changelog records / the replay's time in the worker's log. One probe for the "
        "key waits from before the launch (or is produced at the kill), and nothing follows it; a "
        "run in which keylane's stall check had to read a probe's partition again fails. Sizes: "
        "`BENCH_RECOVERY_KEYS` sets the full run's (default 10,000 and 100,000). In the second table, "
        "times are seconds from the launch (or the kill) to lines of the worker's log: *rebalance* "
        "when the survivor's rebalance began, *restored* when its tables were current, *timer index* "
        "when keylane had rebuilt its timer index from a scan of the whole table, which it does "
        "after every rebalance on the event loop.",
        "",
        *recovery_table(results),
        "",
        "## Notes",
        "",
        "- Overhead is activation wall time minus the configured provider latency. It includes how late "
        "`asyncio.sleep` wakes: `timer_baseline_50ms` measures that alone under the same concurrency. "
        "Both run on an event loop whose timers wake to the microsecond (select(2)): on epoll's "
        "whole-millisecond grid the concurrent keys wake together and the figure follows the burst's "
        "length modulo 1 ms.",
        "",
        *[f"![{name}]({relative}/{name})" for name in made],
    ]
    path.write_text("\n".join(lines) + "\n")
