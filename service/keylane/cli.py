"""The ``keylane`` command: topic administration, the agent worker and the effector.

Every operator error (bad flag, bad setting, unreachable broker, topic drift) prints one
line naming the fix and exits non-zero; tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

from keylane.catalog import ERRORS, Catalog, load_catalog
from keylane.config import Settings
from keylane.errors import ConfigError, KeylaneError, UserCodeFailed
from keylane.kafka.topic_admin import admin_client, apply_catalog, inspect_catalog
from keylane.wire import KeyAction, KeyCommand

if TYPE_CHECKING:
    from keylane.dead_letters import DeadLetter
    from keylane.inspect import KeyView

EXIT_OK = 0
EXIT_FAILED = 1  # the command ran and found a problem (drift, refusal, unreachable broker)
EXIT_USAGE = 2  # the command line itself is wrong


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line and points at --help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The innermost parser a command line reached: it reports the words nobody took, so
        # the line points at that subcommand's --help, whose options the user was after.
        self.set_defaults(reached=self)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def _subcommands(parser: _Parser, dest: str, metavar: str) -> argparse._SubParsersAction[_Parser]:
    """``parser``'s subcommands, optional to argparse so that a stray option is reported as
    itself ("unrecognized arguments: --bogus") rather than as a missing subcommand; a
    missing one is reported by ``main`` through the parser left in ``choose_from``."""
    subcommands = parser.add_subparsers(dest=dest, metavar=metavar, parser_class=_Parser)
    parser.set_defaults(handler=None, choose_from=(parser, metavar, subcommands))
    return subcommands


def _connection_options() -> _Parser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--bootstrap-servers",
        metavar="HOST:PORT[,...]",
        help="Kafka bootstrap servers (env KEYLANE_BOOTSTRAP_SERVERS; default: the broker 'make run' "
        "or 'make broker' started, from .kafka-local/keylane.env, else 127.0.0.1:9092)",
    )
    common.add_argument(
        "--topic-prefix",
        metavar="PREFIX",
        help="prefix for every topic name (env KEYLANE_TOPIC_PREFIX; default none)",
    )
    return common


def _process_options() -> _Parser:
    process = _Parser(add_help=False)
    process.add_argument(
        "--app-id",
        help="Faust application id: consumer group and changelog names (env KEYLANE_APP_ID; default "
        "keylane, after the topic prefix when there is one: prod.keylane)",
    )
    process.add_argument(
        "--data-dir", help="directory for RocksDB tables (env KEYLANE_DATA_DIR; default .keylane-data)"
    )
    process.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="port of /metrics, /healthz and /readyz, 0 disables them (env KEYLANE_METRICS_PORT; "
        "default 9464)",
    )
    return process


def build_parser() -> argparse.ArgumentParser:
    """The full command-line grammar; every subcommand has --help."""
    common = _connection_options()
    parser = _Parser(prog="keylane", description="A Kafka-native runtime for keyed LLM agents.")
    commands = _subcommands(parser, "command", "COMMAND")

    topics = commands.add_parser("topics", help="create or check the topics in topics/catalog.toml")
    topic_cmds = _subcommands(topics, "topics_command", "ACTION")
    apply = topic_cmds.add_parser(
        "apply",
        parents=[common],
        help="create missing topics; refuse when a partition count differs from the catalog",
        description="Create missing catalog topics and fix drifted topic configs. Refuses, changing "
        "nothing, when an existing topic's partition count differs from the catalog.",
    )
    apply.set_defaults(handler=_topics_apply)
    check = topic_cmds.add_parser(
        "check",
        parents=[common],
        help="report drift between the catalog and the broker; change nothing",
        description="Report every difference between the catalog and the broker. Exit 1 on any drift.",
    )
    check.set_defaults(handler=_topics_check)
    show = topic_cmds.add_parser("list", parents=[common], help="print the catalog with the prefix applied")
    show.set_defaults(handler=_topics_list)

    process = _process_options()
    process_app_id = _Parser(add_help=False)
    process_app_id.add_argument(
        "--app-id",
        help="the workers' app id, whose state changelog is read (env KEYLANE_APP_ID; default keylane, "
        "after the topic prefix when there is one)",
    )
    worker = commands.add_parser(
        "worker",
        parents=[common, process],
        help="run an agent worker",
        description="Run an agent: consume its events, results and approvals, one activation at a time "
        "per key. It refuses to start until the catalog topics exist.",
    )
    worker.add_argument(
        "--agent",
        required=True,
        metavar="MODULE:FUNCTION",
        help="the agent, e.g. examples.support_agent:agent",
    )
    worker.add_argument(
        "--config",
        metavar="MODULE:ATTRIBUTE",
        help="its AgentConfig (default: the agent module's 'config', else the defaults)",
    )
    worker.add_argument(
        "--provider",
        metavar="URL",
        help="the model provider, e.g. openai+http://127.0.0.1:8000/v1?model=qwen "
        "(overrides KEYLANE_PROVIDER and the config's provider_factory; see docs/providers.md)",
    )
    worker.set_defaults(handler=_worker)

    effector = commands.add_parser(
        "effector",
        parents=[common, process],
        help="run the effector that executes side-effect intents",
        description="Consume agent.intents, execute each side-effect tool once in effect, and publish "
        "its ToolResult on agent.results.",
    )
    effector.add_argument(
        "--tools",
        required=True,
        action="append",
        metavar="MODULE",
        help="module whose @tool(side_effect=True) functions may run (repeatable)",
    )
    effector.add_argument(
        "--tool-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="default timeout of one tool execution (default 60)",
    )
    effector.set_defaults(handler=_effector)

    inspect = commands.add_parser(
        "inspect",
        parents=[common, process_app_id],
        help="show a key's stored state (memory, suspension, cache, queued events, timers)",
        description="Show a key's state as its worker would restore it, read from the state changelog: "
        "it needs no worker running and disturbs none. An activation running now is not in it yet.",
    )
    inspect.add_argument("key", metavar="KEY", help="the physical key (e.g. customer-7, or customer-7#2)")
    inspect.add_argument(
        "--logical", action="store_true", help="KEY is a logical key: show each of its shards KEY#i"
    )
    inspect.add_argument("--json", action="store_true", help="one JSON object per key, for scripts")
    inspect.set_defaults(handler=_inspect)

    errors = commands.add_parser("errors", help="list, show and re-drive dead letters (agent.errors)")
    error_cmds = _subcommands(errors, "errors_command", "ACTION")
    chosen = _Parser(add_help=False)
    chosen.add_argument(
        "--reason", metavar="REASON", help="only dead letters of this reason (e.g. activation_error)"
    )
    chosen.add_argument("--key", metavar="KEY", help="only dead letters of this entity key")
    chosen.add_argument(
        "--since",
        type=_since,
        metavar="TIME",
        help="only dead letters written since TIME: a duration back from now (30m, 2h, 1d) or an ISO "
        "time, UTC unless it names its offset (2024-05-01T12:00)",
    )
    chosen.add_argument(
        "--max-redrives",
        type=int,
        default=3,
        metavar="M",
        help="a dead letter whose record failed again after M re-drives is quarantined: not re-driven "
        "(default 3)",
    )
    error_list = error_cmds.add_parser(
        "list",
        parents=[common, chosen],
        help="one line per dead letter, with counts by reason",
        description="Read agent.errors and print one line per dead letter (the first of each id): id, "
        "time (UTC), reason, key, origin topic/partition@offset, re-drive count, status and the "
        "detail's start; then counts by reason.",
    )
    error_list.add_argument(
        "--json", action="store_true", help="one JSON object per dead letter, for scripts"
    )
    error_list.set_defaults(handler=_errors_list)
    error_show = error_cmds.add_parser(
        "show",
        parents=[common],
        help="everything in one dead letter, and its re-drive history",
        description="Print a dead letter whole: reason, detail, origin, key, the raw key and value (text "
        "when UTF-8, else base64; size, sha256 and prefix when they were too large to keep) and its "
        "re-drive history: the dead letters it descends from, its re-drives on the origin topic and "
        "the dead letters they became.",
    )
    error_show.add_argument("id", metavar="ID", help="the dead letter's id (its keylane.id header)")
    error_show.add_argument(
        "--max-redrives", type=int, default=3, metavar="M", help="the quarantine limit shown (default 3)"
    )
    error_show.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    error_show.set_defaults(handler=_errors_show)
    redrive = error_cmds.add_parser(
        "redrive",
        parents=[common, chosen],
        help="produce dead letters again to their origin topic, once each",
        description="Produce each selected dead letter's raw key and value to its origin topic (under "
        "this deployment's prefix), as a new record the worker runs, with headers naming the dead "
        "letter and its re-drive count, and who re-drove it and why (keylane.redrive-by: the audit "
        "record). Once per dead letter: one already re-driven (a record on its origin topic says "
        "so) is skipped, so an interrupted run resumes where it stopped and a second run sends "
        "nothing. Fix the cause first. Run one re-drive at a time.",
    )
    redrive.add_argument("--dry-run", action="store_true", help="print what would be sent; send nothing")
    redrive.add_argument(
        "--operator", metavar="NAME", help="who re-drives, for the audit header (not with --dry-run)"
    )
    redrive.add_argument(
        "--why", metavar="TEXT", help="why, e.g. the fix, for the audit header (not with --dry-run)"
    )
    redrive.add_argument(
        "--rate", type=float, default=100.0, metavar="N", help="at most N records a second (default 100)"
    )
    redrive.set_defaults(handler=_errors_redrive)

    approve = commands.add_parser(
        "approve",
        parents=[common],
        help="approve (or --deny) a pending approval request",
        description="Publish a decision on agent.approvals under the request's physical key; it "
        "resumes the suspended agent if it arrives before the deadline. It first reads "
        "agent.approval-requests and agent.approvals, and refuses (exit 1, one line saying why) "
        "when no request for the intent waits on that key: none was made, it was made under "
        "another key, it was decided already, or its deadline passed.",
    )
    approve.add_argument("--key", required=True, help="the physical key from the request (e.g. customer-7#2)")
    approve.add_argument("--intent", required=True, metavar="ID", help="the request's intent id")
    approve.add_argument("--deny", action="store_true", help="deny instead of approve")
    approve.add_argument("--approver", required=True, metavar="NAME", help="who decided")
    approve.add_argument("--reason", metavar="TEXT", help="why, for the record")
    approve.add_argument(
        "--force",
        action="store_true",
        help="send the decision without checking that its request is waiting (a decision that "
        "resumes nothing becomes an orphaned_result on agent.errors, or is ignored)",
    )
    approve.set_defaults(handler=_approve)

    approvals = commands.add_parser("approvals", help="list approval requests")
    approval_cmds = _subcommands(approvals, "approvals_command", "ACTION")
    listing = approval_cmds.add_parser(
        "list",
        parents=[common],
        help="pending approval requests with their deadlines",
        description="Read agent.approval-requests and agent.approvals; print the requests still waiting, "
        "or with --all every request with the outcome its agent saw: the first decision sent before "
        "the deadline decides, later and late ones are ignored (the note column says which).",
    )
    listing.add_argument("--all", action="store_true", help="also show decided and expired requests")
    listing.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per request (key, intent_id, status, decision, notes, ...) instead",
    )
    listing.set_defaults(handler=_approvals_list)

    cancel = commands.add_parser(
        "cancel",
        parents=[common, process_app_id],
        help="end a key's suspension through its agent's HITL policy, as a timeout would",
        description="Publish a cancel on agent.control under the key: its lane ends the key's suspension "
        "through the agent's HITL timeout policy (told who cancelled and why; an Escalate is taken as "
        "Deny), then runs the events queued behind it. The record is the audit log of the action.",
    )
    _key_command_arguments(cancel, "cancels", "not suspended", why="why, for the audit log and the policy")
    cancel.set_defaults(handler=_cancel)

    pause = commands.add_parser(
        "pause",
        parents=[common, process_app_id],
        help="hold a key's inputs (events, results, approvals) until it is resumed",
        description="Publish a pause on agent.control under the key: from then on its lane holds every "
        "input of the key in its state, in order (bounded by the agent's max_buffered_events and "
        "max_buffered_bytes), while every other key keeps running; its timers wait too. The pause is "
        "part of the key's state: it survives restarts and rebalances. The record is the audit log.",
    )
    resume = commands.add_parser(
        "resume",
        parents=[common, process_app_id],
        help="run what a paused key held, in order, and let its inputs through again",
        description="Publish a resume on agent.control under the key: its lane runs the inputs the key "
        "held, in the order they arrived, then its new inputs as before. The record is the audit log.",
    )
    _key_command_arguments(pause, "pauses", "paused")
    _key_command_arguments(resume, "resumes", "not paused")
    pause.set_defaults(handler=partial(_pause_or_resume, "pause"))
    resume.set_defaults(handler=partial(_pause_or_resume, "resume"))
    return parser


def _key_command_arguments(
    parser: argparse.ArgumentParser, verb: str, refused_when: str, *, why: str = "why, for the audit log"
) -> None:
    """The arguments every operator command on one key takes (cancel, pause, resume)."""
    parser.add_argument("key", metavar="KEY", help="the physical key (a sharded key's shard: KEY#i)")
    parser.add_argument(
        "--shards",
        type=int,
        metavar="N",
        help="KEY is the logical key of a sharded agent: send the command to each of its N shards "
        "KEY#0 ... KEY#N-1 (N is the agent's AgentConfig.shards)",
    )
    parser.add_argument("--operator", required=True, metavar="NAME", help=f"who {verb}, for the audit log")
    parser.add_argument("--reason", required=True, metavar="TEXT", help=why)
    parser.add_argument("--force", action="store_true", help=f"send it even if the key is {refused_when} now")


def _settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env(
        bootstrap_servers=args.bootstrap_servers,
        topic_prefix=args.topic_prefix,
        app_id=getattr(args, "app_id", None),
        data_dir=getattr(args, "data_dir", None),
        metrics_port=getattr(args, "metrics_port", None),
        provider=getattr(args, "provider", None),
    )


def _catalog(settings: Settings) -> Catalog:
    return load_catalog(prefix=settings.topic_prefix, replication_factor=settings.replication_factor)


def _topics_apply(args: argparse.Namespace) -> int:
    settings = _settings(args)
    catalog = _catalog(settings)

    async def run() -> int:
        async with admin_client(settings) as client:
            result = await apply_catalog(client, catalog)
        for name in result.created:
            print(f"created      {name}")
        for name in result.reconfigured:
            print(f"reconfigured {name}")
        for warning in result.warnings:
            print(f"warning      {warning}")
        verdict = "changed" if result.changed else "nothing to change"
        print(
            f"{len(result.created)} created, {len(result.reconfigured)} reconfigured, "
            f"{len(result.unchanged)} unchanged: {verdict}"
        )
        return EXIT_OK

    return asyncio.run(run())


def _topics_check(args: argparse.Namespace) -> int:
    settings = _settings(args)
    catalog = _catalog(settings)

    async def run() -> int:
        async with admin_client(settings) as client:
            reports = await inspect_catalog(client, catalog)
        problems = 0
        for report in reports:
            if report.status == "ok":
                print(f"ok       {report.spec.name}")
            elif report.status == "missing":
                problems += 1
                print(f"missing  {report.spec.name}")
            else:
                problems += 1
                print(f"drift    {report.spec.name}: " + "; ".join(str(d) for d in report.drifts))
        if problems:
            print(
                f"{problems} of {len(reports)} topics differ from the catalog; "
                "'keylane topics apply' fixes what it safely can"
            )
            return EXIT_FAILED
        print(f"all {len(reports)} topics match the catalog")
        return EXIT_OK

    return asyncio.run(run())


def _topics_list(args: argparse.Namespace) -> int:
    catalog = _catalog(_settings(args))
    print(f"{'topic':<40} {'partitions':>10} {'rf':>3} {'cleanup':<8} {'retention_ms':>12} {'max_bytes':>9}")
    for spec in catalog:
        print(
            f"{spec.name:<40} {spec.partitions:>10} {spec.replication_factor:>3} {spec.cleanup_policy:<8} "
            f"{spec.retention_ms:>12} {spec.max_message_bytes:>9}"
        )
    return EXIT_OK


def _worker(args: argparse.Namespace) -> int:
    from keylane.stages.worker import run_worker  # imports Faust; keep `keylane --help` fast

    settings = _settings(args)
    return run_worker(settings, _catalog(settings), agent_ref=args.agent, config_ref=args.config)


def _effector(args: argparse.Namespace) -> int:
    from keylane.stages.worker import run_effector

    if not 0 < args.tool_timeout < float("inf"):  # nan too
        raise ConfigError(f"--tool-timeout must be a number of seconds above 0, got {args.tool_timeout}")
    settings = _settings(args)
    return run_effector(
        settings, _catalog(settings), tool_modules=args.tools, tool_timeout_s=args.tool_timeout
    )


def _inspect(args: argparse.Namespace) -> int:
    from keylane.inspect import inspect_keys, summary

    settings = _settings(args)
    views = asyncio.run(inspect_keys(settings, _catalog(settings), args.key, logical=args.logical))
    if not views:
        raise KeylaneError(
            f"no shard of {args.key!r} ({args.key}#0, #1, ...) has state in {settings.app_id}'s changelog; "
            "without --logical, KEY is read as a physical key"
        )
    now_ms = time.time_ns() // 1_000_000
    for view in views:
        shown = summary(view, now_ms=now_ms)
        if args.json:
            print(json.dumps(shown, sort_keys=True))
            continue
        print(f"{view.key} (changelog partition {view.partition}, offset {view.offset})")
        if view.unreadable is not None:
            print(f"  unreadable: {view.unreadable}; its inputs are dead-lettered as poison_state")
        elif view.state is None:
            print("  no state: the key has not committed an activation, or its state was deleted")
        for name, value in shown.items():
            if name not in ("key", "changelog_partition", "changelog_offset", "state", "unreadable"):
                print(f"  {name:<20} {json.dumps(value, sort_keys=True)}")
    return EXIT_OK


def _since(text: str) -> int:
    from keylane.dead_letters import parse_since

    try:
        return parse_since(text, now_ms=time.time_ns() // 1_000_000)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _selected(args: argparse.Namespace) -> tuple[Settings, Catalog, list[DeadLetter]]:
    from keylane.dead_letters import Selection, load

    if args.max_redrives < 1:
        raise ConfigError(f"--max-redrives must be at least 1, got {args.max_redrives}")
    settings = _settings(args)
    catalog = _catalog(settings)
    chosen = Selection(reason=args.reason, key=args.key, since_ms=args.since)
    return settings, catalog, [d for d in asyncio.run(load(settings, catalog)) if chosen(d)]


def _errors_list(args: argparse.Namespace) -> int:
    from keylane.dead_letters import to_json, utc

    _, _, dead_letters = _selected(args)
    dead_letters.sort(key=lambda d: (d.at_ms, d.id))
    if args.json:
        for dead in dead_letters:
            print(json.dumps(to_json(dead, max_redrives=args.max_redrives), sort_keys=True))
        return EXIT_OK
    print(
        f"{'id':<36} {'time (UTC)':<19} {'reason':<20} {'key':<24} {'origin':<32} "
        f"{'redrives':>8} {'status':<12} detail"
    )
    for dead in dead_letters:
        origin = dead.error.origin
        where = "-" if origin is None else f"{origin.topic}/{origin.partition}@{origin.offset}"
        status = dead.status(max_redrives=args.max_redrives)
        print(
            f"{dead.id:<36} {utc(dead.at_ms):<19} {dead.error.reason:<20} {dead.key or '-':<24} "
            f"{where:<32} {dead.error.redrives:>8} {status:<12} {_short(dead.error.detail)}"
        )
    reasons = Counter(d.error.reason for d in dead_letters)
    by_reason = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items())) or "none"
    quarantined = sum(d.status(max_redrives=args.max_redrives) == "quarantined" for d in dead_letters)
    print(f"{len(dead_letters)} dead letters: {by_reason}; {quarantined} quarantined")
    return EXIT_OK


def _short(detail: str, width: int = 60) -> str:
    line = " ".join(detail.split())
    return line if len(line) <= width else line[: width - 3] + "..."


def _errors_show(args: argparse.Namespace) -> int:
    from keylane.dead_letters import UnknownDeadLetter, find_redriven, history, load, search_space, to_json

    settings = _settings(args)
    catalog = _catalog(settings)

    async def run() -> dict[str, Any]:
        dead_letters = await load(settings, catalog)
        dead = next((d for d in dead_letters if d.id == args.id), None)
        if dead is None:
            raise UnknownDeadLetter(
                f"no dead letter {args.id} on {catalog.name(ERRORS)}; 'keylane errors list' shows their ids"
            )
        redriven = await find_redriven(settings, search_space([dead], catalog))
        shown = to_json(dead, max_redrives=args.max_redrives)
        if shown["status"] == "redrivable" and dead.id in redriven:
            shown["status"] = "redriven"
        return {**shown, "history": history(dead, dead_letters, redriven)}

    shown = asyncio.run(run())
    if args.json:
        print(json.dumps(shown, sort_keys=True))
        return EXIT_OK
    for name in (
        "id",
        "reason",
        "at",
        "key",
        "origin",
        "detail",
        "status",
        "redrives",
        "raw_key",
        "raw_value",
    ):
        print(f"{name:<18} {json.dumps(shown.get(name))}")
    for name, value in sorted(shown.items()):
        if name not in _SHOWN_FIRST and not name.startswith("raw_"):
            print(f"{name:<18} {json.dumps(value, sort_keys=True)}")
    print("history")
    for name, value in shown["history"].items():
        print(f"  {name:<16} {json.dumps(value, sort_keys=True)}")
    return EXIT_OK


_SHOWN_FIRST = ("id", "error_id", "reason", "at", "key", "origin", "detail", "status", "redrives", "history")


def _errors_redrive(args: argparse.Namespace) -> int:
    from keylane.dead_letters import Step, find_redriven, plan, search_space, send

    if not args.rate > 0:  # nan too
        raise ConfigError(f"--rate must be above 0, got {args.rate}")
    if not args.dry_run and not ((args.operator or "").strip() and (args.why or "").strip()):
        raise ConfigError(
            "errors redrive needs --operator NAME and --why TEXT (its audit record), or --dry-run"
        )
    settings, catalog, dead_letters = _selected(args)

    def line(step: Step, verb: str, where: str = "") -> None:
        key = step.dead.key or "-"
        print(f"{verb:<12} {step.dead.id} {step.dead.error.reason:<20} {key:<24} {where}")

    def sent(step: Step, partition: int, offset: int) -> None:
        line(step, "re-driven", f"-> {catalog.name(step.topic)}/{partition}@{offset} (re-drive {step.count})")

    async def run() -> tuple[int, Counter[str]]:
        redriven = await find_redriven(settings, search_space(dead_letters, catalog))
        steps = plan(dead_letters, catalog=catalog, redriven=redriven, max_redrives=args.max_redrives)
        for step in steps:
            if step.action != "send":
                line(step, step.action.replace("_", " "), step.why)
            elif args.dry_run:
                line(step, "would send", f"-> {catalog.name(step.topic)} (re-drive {step.count})")
        if args.dry_run:
            return 0, Counter(step.action for step in steps)
        done = await send(
            settings, catalog, steps, rate=args.rate, operator=args.operator, why=args.why, on_sent=sent
        )
        return done, Counter(step.action for step in steps)

    done, actions = asyncio.run(run())
    verdict = f"{actions['send']} would be re-driven" if args.dry_run else f"{done} re-driven"
    print(
        f"{verdict}, {actions['already']} already re-driven, {actions['quarantined']} quarantined, "
        f"{actions['no_bytes'] + actions['not_an_input']} cannot be re-driven"
    )
    return EXIT_OK


def _approve(args: argparse.Namespace) -> int:
    from keylane.approvals import check_waiting, send_approval, span

    settings = _settings(args)
    catalog = _catalog(settings)
    if not args.key.strip() or not args.intent.strip() or not args.approver.strip():
        raise ConfigError("--key, --intent and --approver must not be empty")

    async def run() -> str:
        due = ""
        if not args.force:
            now_ms = time.time_ns() // 1_000_000
            view = await check_waiting(settings, catalog, key=args.key, intent_id=args.intent, now_ms=now_ms)
            due = f", {span(view.request.deadline_ms - now_ms)} before its deadline"
        approval = await send_approval(
            settings,
            catalog,
            key=args.key,
            intent_id=args.intent,
            approved=not args.deny,
            approver=args.approver,
            reason=args.reason,
        )
        verdict = "approved" if approval.approved else "denied"
        signed = f", signed with key {approval.key_id}" if approval.key_id else ""
        return f"{verdict} {approval.intent_id} for {approval.entity_key} by {approval.approver}{signed}{due}"

    print(asyncio.run(run()))
    return EXIT_OK


def _approvals_list(args: argparse.Namespace) -> int:
    from keylane.approvals import approval_requests

    settings = _settings(args)
    now_ms = time.time_ns() // 1_000_000
    views = asyncio.run(approval_requests(settings, _catalog(settings), now_ms=now_ms))
    shown = [v for v in views if args.all or v.status == "pending"]
    if args.json:
        for view in shown:
            print(json.dumps(view.to_json()))
        return EXIT_OK
    notes = ["; ".join(v.notes) for v in shown]
    width = max([4, *map(len, notes)])
    heading = f"{'key':<28} {'intent':<36} {'channel':<12} {'status':<8} {'deadline (UTC)':<20}"
    print(f"{heading} {'note':<{width}} args")
    for view, note in zip(shown, notes, strict=True):
        request = view.request
        deadline = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(request.deadline_ms / 1000))
        print(
            f"{request.entity_key:<28} {request.intent_id:<36} {request.channel:<12} {view.status:<8} "
            f"{deadline:<20} {note:<{width}} {request.args_json}"
        )
    print(f"{sum(v.status == 'pending' for v in views)} pending of {len(views)} requests")
    return EXIT_OK


def _cancel(args: argparse.Namespace) -> int:
    if args.shards is not None:
        return _send_to_shards("cancel", args)
    command, view = _send_key_command("cancel", args)
    waiting = view.state.continuation if view.state is not None else None
    what = (
        f"its suspension at seq {waiting.seq}" if waiting is not None else "its suspension, if any by then,"
    )
    print(
        f"cancel {command.command_id} sent for {command.entity_key} by {command.operator}: {what} ends "
        f"through the agent's HITL policy; 'keylane inspect {command.entity_key}' shows the result"
    )
    return EXIT_OK


def _pause_or_resume(action: KeyAction, args: argparse.Namespace) -> int:
    if args.shards is not None:
        return _send_to_shards(action, args)
    command, view = _send_key_command(action, args)
    held = len(view.state.held) if view.state is not None else 0
    what = (
        "its inputs wait in its state from now on, until 'keylane resume'"
        if action == "pause"
        else f"its {held} held inputs run in order, then its new ones"
    )
    print(
        f"{action} {command.command_id} sent for {command.entity_key} by {command.operator}: {what}; "
        f"'keylane inspect {command.entity_key}' shows the result"
    )
    return EXIT_OK


def _send_to_shards(action: KeyAction, args: argparse.Namespace) -> int:
    """``action`` on every shard of the logical key: one line per shard, sent or skipped."""
    from keylane.key_commands import CommandRefused, send_to_shards

    settings = _checked_key_command(args)
    if args.shards < 1:
        raise ConfigError(f"--shards must be at least 1 (the agent's AgentConfig.shards), got {args.shards}")
    outcomes = asyncio.run(
        send_to_shards(
            settings,
            _catalog(settings),
            key=args.key,
            shards=args.shards,
            action=action,
            operator=args.operator,
            reason=args.reason,
            force=args.force,
        )
    )
    for shard, outcome in outcomes:
        if isinstance(outcome, CommandRefused):
            print(f"{shard}: skipped, {outcome}")
        else:
            print(f"{action} {outcome.command_id} sent for {shard} by {outcome.operator}")
    sent = sum(not isinstance(outcome, CommandRefused) for _, outcome in outcomes)
    if not sent:
        raise KeylaneError(f"no shard of {args.key} took the {action}: each was skipped, as listed above")
    shown = f"'keylane inspect {args.key} --logical' shows the result"
    print(f"{action} sent to {sent} of the {args.shards} shards of {args.key}; {shown}")
    return EXIT_OK


def _checked_key_command(args: argparse.Namespace) -> Settings:
    if not args.key.strip() or not args.operator.strip() or not args.reason.strip():
        raise ConfigError("KEY, --operator and --reason must not be empty")
    return _settings(args)


def _send_key_command(action: KeyAction, args: argparse.Namespace) -> tuple[KeyCommand, KeyView]:
    from keylane.key_commands import send_key_command

    settings = _checked_key_command(args)
    return asyncio.run(
        send_key_command(
            settings,
            _catalog(settings),
            key=args.key,
            action=action,
            operator=args.operator,
            reason=args.reason,
            force=args.force,
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``keylane`` console script."""
    args, stray = build_parser().parse_known_args(argv)
    if stray:
        args.reached.error(f"unrecognized arguments: {' '.join(stray)}")
    if args.handler is None:
        parser, metavar, subcommands = args.choose_from
        parser.error(f"missing {metavar}: one of {', '.join(subcommands.choices)}")
    if args.command in ("topics", "approve", "approvals", "errors", "inspect", "cancel", "pause", "resume"):
        # The admin client logs each failed connection attempt; the one-line error below
        # says the same thing with the fix, so keep its noise off the terminal.
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeylaneError as exc:
        if isinstance(exc, UserCodeFailed):
            print(exc.traceback, end="", file=sys.stderr)
        print(f"keylane: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
