"""The `hetcompile` command line: build, validate, explain, deploy, teardown, migrate, schema,
router, fill-endpoints, profile, simulate.

User errors (`HetcompileError`) print as one clean paragraph with file:line:col and exit 1;
`--debug` shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional, cast

import typer
from rich.console import Console

from hetcompile.plan import human
from hetcompile import __version__
from hetcompile.errors import EXIT_INTERNAL, HetcompileError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Compile LLM serving specs into plans for mixed GPU fleets.")
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)
_state = {"debug": False}


def _fail(exc: HetcompileError) -> None:
    if _state["debug"]:
        raise exc
    err.print(str(exc), markup=False)
    raise typer.Exit(code=exc.exit_code)


def _print_version(value: bool) -> None:
    if value:
        out.print(f"hetcompile {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    debug: bool = typer.Option(False, "--debug", help="show tracebacks for errors"),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="print the version and exit"),
) -> None:
    _state["debug"] = debug


SUMMARY_WORKLOADS = 5  # workloads the build's `simulated:` line names; plan.md lists every one


def _summary_workloads(ws):
    """The verified workloads the one-line summary names, in name order: all of them up to
    SUMMARY_WORKLOADS; beyond, the missed ones first, then those closest to their TTFT target (a
    spec of thousands of workloads keeps a one-line summary)."""
    if len(ws) <= SUMMARY_WORKLOADS:
        return list(ws)

    def closeness(w) -> float:
        return (w.ttft_s or 0.0) / w.ttft_target_s if w.ttft_target_s else 0.0

    chosen = sorted(ws, key=lambda w: (w.met, -closeness(w), w.name))[:SUMMARY_WORKLOADS]
    return sorted(chosen, key=lambda w: w.name)


@app.command()
def build(
    spec: Path = typer.Argument(..., help="spec.yaml"),
    output: Path = typer.Option(Path("out"), "-o", "--output", help="output directory"),
    stop_after: Optional[str] = typer.Option(None, "--stop-after", help="stop after this pass and dump its IR"),
    dump_after: List[str] = typer.Option([], "--dump-after", help="write OUT/ir/<pass>.json after this pass"),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no pass log, progress line or summary: errors and warnings only"),
    previous: Optional[Path] = typer.Option(
        None, "--previous", help="replan against OLD/plan.json: prefer keeping its running replicas"
    ),
    churn_penalty: str = typer.Option(
        "1%", "--churn-penalty", help="with --previous: what one replica launched or torn down costs, as a share of the previous plan's objective (e.g. 2%, 0.02)"
    ),
    no_verify: bool = typer.Option(False, "--no-verify", help="skip pass 7, the simulation that checks the plan's "
                                   "SLOs and queueing bounds and replans until they hold (a quick look; plan.md says it is unverified)"),
    jobs: int = typer.Option(0, "-j", "--jobs", min=0, help="processes for the verification's replications "
                             "(0: one per core, at most 4; the plan does not depend on it)"),
    observed: Optional[Path] = typer.Option(None, "--observed", help="an observed.yaml (`hetcompile observe`): plan for its "
                                            "measured rates and lengths, with its step-time corrections"),
) -> None:
    """Compile SPEC into a plan and its artifacts under OUT."""
    from hetcompile.plan.canon import dumps_json
    from hetcompile.backends.emit import write
    from hetcompile.ir.document import totals
    from hetcompile.driver import compile_spec
    from hetcompile.live import LiveLine

    log = (lambda m: None) if quiet else (lambda m: err.print(f"  {m}", markup=False))
    # on a terminal, a pass running past 2 s shows a live line (pass, elapsed, incumbent, bound, gap)
    live = LiveLine(sys.stderr) if not quiet and sys.stderr.isatty() else None
    live_args = dict(log=live.log, status=live.solver, on_pass=live.pass_started) if live else {}
    try:
        from hetcompile.ir import units

        try:
            churn = units.parse_fraction(churn_penalty)
            if not 0 <= churn <= 1:  # also NaN
                raise ValueError(f"a churn penalty must be between 0 and 100%, got {churn_penalty}")
        except ValueError as exc:
            raise HetcompileError(f"--churn-penalty {churn_penalty!r}: {exc}", hint="give a share such as 2% or 0.02") from None
        from hetcompile.observe.run import read_observed

        obs = read_observed(observed) if observed is not None else None
        res = compile_spec(spec, stop_after=stop_after, dump_after=tuple(dump_after), previous=previous,
                           churn_penalty=churn, verify=not no_verify, workers=jobs or min(4, os.cpu_count() or 1), observed=obs,
                           **{"log": log, **live_args})
        if live:  # the passes are done; what follows prints its own lines
            live.close()
            live = None
        _print_warnings(res.ir.warnings)
        for name, ir in res.dumps.items():
            (output / "ir").mkdir(parents=True, exist_ok=True)
            (output / "ir" / f"{name}.json").write_text(dumps_json(ir.model_dump(mode="json")))
        if res.stopped_after:
            (output / "ir").mkdir(parents=True, exist_ok=True)
            path = output / "ir" / f"{res.stopped_after}.json"
            path.write_text(dumps_json(res.ir.model_dump(mode="json")))
            out.print(f"stopped after {res.stopped_after}: IR in {path}")
            return
        from hetcompile.explain.pictures import pictures

        files = write(res.ir, output, pictures)
    except HetcompileError as exc:
        _fail(exc)
        return
    finally:
        if live:
            live.close()
    if not quiet:
        t = totals(res.ir)  # the plan's totals, without building plan.json a second time
        assert res.ir.replicas is not None  # a built plan has them
        num = lambda x: human.number(x, 6)  # noqa: E731
        out.print(
            f"plan {res.ir.name}: {human.plural(len(res.ir.replicas), 'replica')} on {human.plural(t.gpus, 'GPU')}, "
            f"{human.number(t.requests_per_s)} req/s, {human.number(t.tokens_per_s)} tokens/s, {human.money(t.price_per_hour)} "
            f"(objective {num(t.objective_value)} {t.objective_unit}, bound {num(t.bound)}, gap {human.percent(t.gap)})",
            markup=False,
        )
        if t.bound is None:  # say why, instead of a bare '-'
            out.print(f"  bound: {t.bound_source.removeprefix('none: ')}", markup=False)
        for b in t.binding:
            out.print(f"  binds: {b.text}", markup=False)
        what_if = res.ir.composition.what_if if res.ir.composition is not None else None
        for line in (what_if.text if what_if is not None else ()):
            out.print(f"  takes: {line}", markup=False)
        if what_if is None and previous is not None and res.ir.objective == "max-throughput":
            out.print("  takes: not computed for a replan (--previous): the budget sweep would price the churn too; "
                      "build without --previous to see what serving all demand takes", markup=False)
        v = res.ir.verification
        if v is not None:  # what the build's simulation measured (simulate/verify.py), one line
            shown = _summary_workloads(v.workloads)
            held = "; ".join(
                f"{w.name} {w.percentile} TTFT {human.number(w.ttft_s)} s"
                + (f" ({'bound' if w.target == 'queueing' else 'target'} {human.number(w.ttft_target_s)} s)"
                   if w.ttft_target_s is not None else "")
                + (f", TPOT {human.number(w.tpot_s)} s" if w.tpot_s is not None else "")
                + (f" (target {human.number(w.tpot_target_s)} s)" if w.tpot_target_s is not None else "")
                + ("" if w.met else " MISSED")
                for w in shown)
            named = {w.name for w in shown}
            rest = [w for w in v.workloads if w.name not in named]
            if rest:
                missed = sum(not w.met for w in rest)
                held += (f"; and {len(rest)} more workloads, {f'{missed} missed' if missed else 'all met'} "
                         "(plan.md lists each)")
            from hetcompile.passes.verify import simulated_text

            out.print(f"  simulated: {simulated_text(v, human.number)} "
                      f"({v.requests} requests, {human.plural(v.rounds, 'plan')} tried): {held}", markup=False)
        elif no_verify:
            out.print("  not verified: built with --no-verify (the SLOs and queueing bounds are the tail model's, unsimulated)",
                      markup=False)
        elif (skipped := next((p for p in res.ir.reports if p.name == "verify" and p.status == "skipped"), None)) \
                and skipped.notes and skipped.notes[0].startswith("not simulated"):
            out.print(f"  not verified: {skipped.notes[0].partition(': ')[2]}", markup=False)
        compose = next((p for p in res.ir.reports if p.name == "compose"), None)
        for note in compose.notes if compose and previous is not None else ():
            if note.startswith(("replanning", "stability")):
                out.print(f"  {note}")
        out.print(f"wrote {len(files)} files to {output}/ (plan.md explains the plan)")


def _print_warnings(warnings: tuple[str, ...]) -> None:
    """Defaults the spec relies on (a catalog price): on stderr, also under --quiet."""
    for w in warnings:
        err.print(f"warning: {w}", markup=False, soft_wrap=True)


@app.command()
def validate(spec: Path = typer.Argument(..., help="spec.yaml")) -> None:
    """Check SPEC (keys, units, names) without solving."""
    from hetcompile.ir.lower import load_problem

    try:
        ir, _, _ = load_problem(spec)
    except HetcompileError as exc:
        _fail(exc)
        return
    _print_warnings(ir.warnings)
    out.print(f"{spec}: ok ({human.plural(len(ir.models), 'model')}, {human.plural(len(ir.workloads), 'workload')}, "
              f"{human.plural(len(ir.offers), 'offer')})")


@app.command()
def explain(
    plan: Path = typer.Argument(..., help="OUT/plan.json or OUT/ (the plan running now, when NEW is given)"),
    new: Optional[Path] = typer.Argument(None, help="a second plan: show what changes from PLAN to NEW and how to migrate"),
    fmt: str = typer.Option("text", "--format", "-f", help="text (terminal), md (markdown + Mermaid), json, dot (Graphviz)"),
) -> None:
    """Why a plan looks the way it does; with NEW, what changes between two plans and how to roll it out."""
    from rich.console import Group

    from hetcompile.explain import explain_plan, read_plan
    from hetcompile.migrate.planner import plan_diff
    from hetcompile.explain.render import FORMATS, Format, render_diff, render_explanation, rich_renderables
    from hetcompile.errors import did_you_mean

    try:
        if fmt not in FORMATS:
            close = did_you_mean(fmt, FORMATS)
            raise HetcompileError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}",
                                  hint=f"did you mean {close!r}?" if close else None)
        form = cast(Format, fmt)  # one of FORMATS
        old_plan = read_plan(plan)
        old_exp = explain_plan(old_plan)
        if new is None:
            from hetcompile.explain.simulation import with_simulation

            result = with_simulation(render_explanation(old_exp, form), plan, fmt)  # + OUT/simulation.json
        else:
            new_plan = read_plan(new)
            result = render_diff(plan_diff(old_plan, new_plan), form, old_exp, explain_plan(new_plan))
    except HetcompileError as exc:
        _fail(exc)
        return
    except (KeyError, TypeError, ValueError) as exc:  # a plan.json hand-edited or from another tool
        if _state["debug"]:
            raise
        _fail(HetcompileError(f"cannot explain {plan}{f' and {new}' if new else ''}: unexpected plan content ({exc!r})"))
        return
    if isinstance(result, str):
        sys.stdout.write(result)
    else:
        out.print(Group(*rich_renderables(result, out.width)))


def _durations(health_timeout: str, drain: str) -> tuple[float, float]:
    from hetcompile.ir.units import parse_duration

    try:
        return parse_duration(health_timeout), parse_duration(drain)
    except ValueError as exc:
        raise HetcompileError(f"--health-timeout / --drain: {exc}") from None


def _dry_run(ro, head: str, timeout_s: float) -> None:
    from hetcompile.migrate.gaps import capacity_gaps, gap_text

    out.print(f"{head}: {ro.migration.mode}, {human.plural(len(ro.actions), 'step')} (dry run)", markup=False)
    for note in ro.notes:
        out.print(f"  note: {note}", markup=False)
    for check in ro.migration.checks:
        out.print(f"  {check}", markup=False)
    for a in ro.actions:
        cmd = " ".join(a.argv) if a.argv else f"sky exec {ro.router_cluster} {ro.new_dir}/{ro.work}/reload.yaml (table: " \
            f"{', '.join(t for t, _, _ in a.endpoints)})"
        if a.stop:
            cmd = " ".join(a.stop) + "\n    " + cmd
        out.print(f"[{a.index}] {a.text}\n    {cmd}", markup=False)
    for g in capacity_gaps(ro):
        out.print(f"refused unless --allow-capacity-gap: {gap_text(g, timeout_s)}", markup=False)


@app.command()
def deploy(
    out_dir: Path = typer.Argument(Path("out"), help="OUT directory of `hetcompile build`"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the steps and their commands; run nothing"),
    allow_capacity_gap: bool = typer.Option(False, "--allow-capacity-gap",
                                            help="run steps that leave a workload with no capacity for a while"),
    health_timeout: str = typer.Option("20min", "--health-timeout", help="how long a launched replica may take to answer /health"),
    drain: str = typer.Option("60s", "--drain", help="the longest wait for a drained replica's in-flight requests"),
    health_poll: float = typer.Option(10.0, "--health-poll", help="seconds between /health probes of a launching replica"),
    parallel: int = typer.Option(8, "--parallel", min=1, help="launches (and teardowns) next to each other in the plan run this many at once"),
) -> None:
    """Make the running fleet match OUT's plan: launch what is missing, replace what changed, tear
    down what no longer belongs, in a capacity-safe order. Re-running converges; a second run launches nothing."""
    import os

    from hetcompile.explain import read_plan
    from hetcompile.migrate import deploy as dep, preflight as pf
    from hetcompile.migrate.run import Runner

    env = dict(os.environ)
    try:
        timeout_s, drain_s = _durations(health_timeout, drain)
        plan = read_plan(out_dir, "plan")
        base = out_dir if out_dir.is_dir() else out_dir.parent
        src = None
        if not dry_run:  # before `sky` is asked anything
            pf.check_tools(env)
            src = pf.hetcompile_src(env)
            pf.check_clouds(sorted({n.cloud for n in plan.nodes if n.cloud}), base, env)
        d = dep.deploy_plan(base, env)
        if dry_run:
            _dry_run(d.rollout, f"deploy {d.rollout.new_plan} ({base})", timeout_s)
            return
        if not d.router_up and any(a.kind in ("route", "drain") for a in d.rollout.actions):
            assert src is not None  # not a dry run: set by the preflight above
            pf.router_wheel(base, src)
        pf.ensure_secrets(base, env)
    except HetcompileError as exc:
        _fail(exc)
        return
    except pf.PreflightFailed as exc:
        err.print(f"deploy: {exc}", markup=False)
        raise typer.Exit(2) from None
    runner = Runner(d.rollout, env=env, health_timeout=timeout_s, drain_s=drain_s, poll=health_poll,
                    log=lambda m: out.print(m, markup=False), after=dep.recorder(d), allow_gap=allow_capacity_gap,
                    parallel=parallel)
    rc = runner.run()
    if rc == 0:
        dep.converged(d)
        if d.rollout.actions:
            out.print(f"clients send: Authorization: Bearer $(cat {base}/router.token)", markup=False)
        url = runner.router_url()
        if url:
            out.print(f"router: {url}/v1 (OpenAI-compatible)", markup=False)
    raise typer.Exit(rc)


@app.command()
def teardown(out_dir: Path = typer.Argument(Path("out"), help="OUT directory that `hetcompile deploy` deployed")) -> None:
    """Tear down every cluster this folder's deploy record holds for its plan (also ones an older
    build of the plan launched), the router, and the plan's own clusters; fail loudly on any left up."""
    import os

    from hetcompile.migrate.deploy import teardown as run_teardown

    try:
        rc = run_teardown(out_dir if out_dir.is_dir() else out_dir.parent, dict(os.environ),
                          lambda m: out.print(m, markup=False), lambda m: err.print(m, markup=False))
    except HetcompileError as exc:
        _fail(exc)
        return
    raise typer.Exit(rc)


@app.command()
def migrate(
    old: Path = typer.Argument(..., help="build directory of the plan running now (deployed with its deploy.sh)"),
    new: Path = typer.Argument(..., help="build directory of the plan to roll out"),
    health_timeout: str = typer.Option("20min", "--health-timeout", help="how long a launched replica may take to answer /health"),
    drain: str = typer.Option("60s", "--drain", help="the longest wait for a drained replica's in-flight requests (its vLLM /metrics shows none: done sooner)"),
    parallel: int = typer.Option(8, "--parallel", min=1, help="launches (and teardowns) next to each other in the plan run this many at once"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the steps and their commands; run nothing"),
    allow_capacity_gap: bool = typer.Option(False, "--allow-capacity-gap",
                                            help="run steps that leave a workload with no capacity for a while"),
) -> None:
    """Carry out the migration `explain OLD NEW` shows: launch, restart, route, drain, tear down, in order."""
    from hetcompile.migrate.actions import rollout_plan
    from hetcompile.migrate.run import Runner

    try:
        timeout_s, drain_s = _durations(health_timeout, drain)
        ro = rollout_plan(old, new)
    except HetcompileError as exc:
        _fail(exc)
        return
    if dry_run:
        _dry_run(ro, f"migrate {ro.old_plan} -> {ro.new_plan}", timeout_s)
        return
    runner = Runner(ro, health_timeout=timeout_s, drain_s=drain_s, log=lambda m: out.print(m, markup=False),
                    allow_gap=allow_capacity_gap, parallel=parallel)
    rc = runner.run()
    if rc == 0:  # NEW's deploy record: a later `hetcompile deploy NEW` keeps what runs
        from hetcompile.migrate.deploy import adopt

        adopt(ro)
    url = runner.router_url() if rc == 0 else None
    if url:
        out.print(f"router: {url}/v1 (OpenAI-compatible)", markup=False)
    raise typer.Exit(rc)


@app.command()
def schema(output: Path = typer.Option(Path("schemas"), "-o", "--output", help="directory")) -> None:
    """Regenerate the JSON schemas of the spec and the routing table."""
    from hetcompile.schemas_gen import schemas

    output.mkdir(parents=True, exist_ok=True)
    for name, text in schemas().items():
        (output / name).write_text(text)
        out.print(f"wrote {output / name}")


@app.command("fill-endpoints")
def fill_endpoints(
    table: Path = typer.Argument(..., help="router/routing.json"),
    endpoints: List[str] = typer.Argument(..., help="REPLICA=URL pairs"),
    in_place: bool = typer.Option(False, "--in-place", help="rewrite TABLE instead of printing"),
) -> None:
    """Write replica endpoints (from `sky status --endpoint`) into a routing table."""
    from hetcompile.plan.canon import dumps_json
    from hetcompile.plan.routing import RoutingTable

    try:
        rt = RoutingTable.model_validate_json(table.read_text())
        pairs = dict(e.split("=", 1) for e in endpoints)
    except Exception as exc:  # pydantic / IO / malformed pairs
        _fail(HetcompileError(f"cannot fill endpoints: {exc}"))
        return
    unknown = set(pairs) - {r.id for r in rt.replicas}
    if unknown:
        _fail(HetcompileError(f"unknown replicas: {', '.join(sorted(unknown))}"))
    reps = tuple(r.model_copy(update={"endpoint": pairs.get(r.id, r.endpoint)}) for r in rt.replicas)
    text = dumps_json(rt.model_copy(update={"replicas": reps}).model_dump(mode="json"))
    if in_place:
        table.write_text(text)
    else:
        sys.stdout.write(text)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
             add_help_option=False)
def router(ctx: typer.Context) -> None:
    """Run the bundled OpenAI-compatible router in front of a plan's replicas (same flags as
    `python -m hetcompile.router`; --help lists them)."""
    from hetcompile.router.options import run

    raise typer.Exit(run(list(ctx.args), prog="hetcompile router"))


def _int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise HetcompileError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise HetcompileError(f"{what}: expected positive integers, got {text!r}")
    return vals


FIT_WARN_RMSE = 0.20  # `hetcompile profile` warns when its fit is further than this from its own measurements


@app.command()
def profile(
    endpoint: str = typer.Argument(..., help="base URL of a running vLLM OpenAI server, e.g. http://10.0.0.5:8000"),
    model: str = typer.Option(..., "--model", help="the spec's model name this server runs"),
    gpu: str = typer.Option(..., "--gpu", help="GPU type of the server (a catalog or spec gpus: name)"),
    tp: int = typer.Option(1, "--tp", help="tensor-parallel size per node"),
    pp: int = typer.Option(1, "--pp", help="pipeline stages"),
    output: Path = typer.Option(Path("profiles.yaml"), "-o", "--output", help="profiles file to write"),
    served_name: Optional[str] = typer.Option(None, "--served-name", help="model name the server answers to (default: the first of /v1/models)"),
    concurrency: str = typer.Option("1,4,16", "--concurrency", help="concurrency levels of the sweep"),
    prompts: str = typer.Option("16,64,128", "--prompts", help="prompt lengths (tokens) of the sweep"),
    output_tokens: int = typer.Option(32, "--output-tokens", help="output tokens per request"),
    requests: int = typer.Option(2, "--requests", help="requests per client and sweep point"),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="environment variable holding the server's API key "
                                              "(vLLM --api-key; a deployed replica's is HC_VLLM_API_KEY, in OUT/vllm.key)"),
) -> None:
    """Measure a running vLLM server with a bounded load sweep; fit the step-time model; write a profiles file."""
    from hetcompile.plan.canon import dumps_yaml
    from hetcompile.profiling import SweepConfig, profile as run_profile

    try:
        if tp < 1 or pp < 1 or output_tokens < 2 or requests < 1:
            raise HetcompileError("--tp, --pp and --requests must be >= 1 and --output-tokens >= 2")
        key = None
        if api_key_env is not None:
            import os

            key = os.environ.get(api_key_env)
            if not key:
                raise HetcompileError(f"--api-key-env {api_key_env}: {api_key_env} is not set in the environment")
        cfg = SweepConfig(concurrency=_int_list(concurrency, "--concurrency"), prompt_tokens=_int_list(prompts, "--prompts"),
                          output_tokens=output_tokens, requests=requests, api_key=key)

        def show(pt) -> None:
            err.print(f"prompt {pt.prompt_tokens:>5}  concurrency {pt.concurrency:>3}:  TTFT {1000 * pt.ttft_s:8.2f} ms  "
                      f"request {1000 * pt.e2e_s:8.2f} ms  {pt.output_tokens_per_s:9.1f} output tok/s")

        entry, fit, points = run_profile(endpoint, model, gpu, tp, pp, cfg, served_name, show)
    except HetcompileError as exc:
        _fail(exc)
        return
    except ValueError as exc:  # the fit had nothing to work with
        _fail(HetcompileError(f"cannot fit the step model: {exc}"))
        return
    header = (f"# measured by `hetcompile profile {endpoint} --model {model} --gpu {gpu} --tp {tp} --pp {pp}`\n"
              f"# include it from a spec: `profiles: [{output.name}]`\n")
    output.write_text(header + dumps_yaml([entry]))
    out.print(f"step {1000 * fit.step_s:.3f} ms + {1e6 * fit.per_token_s:.3f} us/token + {1e9 * fit.per_kv_token_s:.3f} "
              f"ns/context token; request overhead {1000 * fit.request_s:.3f} ms; fit rel. RMSE {100 * fit.rel_rmse:.1f}% "
              f"over {fit.rows} points")
    if fit.rel_rmse > FIT_WARN_RMSE:
        err.print(f"warning: the fit misses the measurements by {100 * fit.rel_rmse:.0f}% (relative RMSE, above "
                  f"{100 * FIT_WARN_RMSE:.0f}%): the linear step model does not describe this server's sweep well (a busy "
                  "host, too few requests per point, or a server that changed during the sweep). A plan built on it "
                  "inherits the error: profile again on an idle machine, with more --requests", markup=False, soft_wrap=True)
    err.print(f"wrote {output}")



@app.command()
def simulate(
    out_dir: Path = typer.Argument(..., help="OUT directory of `hetcompile build` (or its plan.json)"),
    duration: str = typer.Option("300s", "--duration", help="arrivals are generated over this long, e.g. 300s, 5min"),
    arrivals: str = typer.Option("poisson", "--arrivals", help="'poisson' (per workload at the plan's rates) or a JSONL trace"),
    seed: int = typer.Option(0, "--seed", help="seed of the Poisson arrivals"),
    load: float = typer.Option(1.0, "--load", help="multiple of the plan's served rates to offer (poisson)"),
    stages: Optional[str] = typer.Option(None, "--stages", help="a load that changes over time, e.g. '0.4:600s,1.0:600s' "
                                         "(load multiple:duration, one after the other; replaces --load and --duration)"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="where to write simulation.json (default OUT/simulation.json)"),
) -> None:
    """Replay arrivals through the plan's replicas and router weights (discrete-event); write simulation.json."""
    from hetcompile.plan.canon import dumps_json
    from hetcompile.explain.doc import Doc
    from hetcompile.explain.render import rich_renderables
    from hetcompile.explain.simulation import simulation_section
    from hetcompile.plan.io import read_plan_doc
    from hetcompile.ir.units import parse_duration
    from hetcompile.simulate import simulate as run_simulation, staged_arrivals, steady_arrivals, trace_arrivals

    try:
        plan = read_plan_doc(out_dir)
        try:
            seconds = parse_duration(duration)
        except ValueError as exc:
            raise HetcompileError(f"--duration: {exc}") from None
        if not seconds > 0:
            raise HetcompileError(f"--duration must be positive, got {duration!r}")
        if load <= 0:
            raise HetcompileError(f"--load must be positive, got {load}")
        if stages is not None:
            if arrivals != "poisson":
                raise HetcompileError("--stages generates Poisson arrivals: leave out --arrivals")
            steps = _parse_stages(stages, parse_duration)
            seconds, load = sum(d for _, d in steps), max(x for x, _ in steps)
            doc = run_simulation(plan, staged_arrivals(plan, steps, seed), seconds, seed=seed, load=load,
                                 arrivals_name="poisson stages " + stages.replace(" ", ""))
        elif arrivals == "poisson":
            doc = run_simulation(plan, steady_arrivals(plan, seconds, seed, load), seconds, seed=seed, load=load,
                                 arrivals_name="poisson")
        else:
            # a trace's arrivals after --duration keep the load on, unmeasured (simulate/run.py)
            doc = run_simulation(plan, trace_arrivals(plan, Path(arrivals)), seconds, seed=seed, load=1.0,
                                 arrivals_name=Path(arrivals).name)
    except HetcompileError as exc:
        _fail(exc)
        return
    base = out_dir if out_dir.is_dir() else out_dir.parent
    target = output or base / "simulation.json"
    target.write_text(dumps_json(doc.model_dump(mode="json")))
    from rich.console import Group

    out.print(Group(*rich_renderables(Doc(f"simulation of {plan.plan}", (), (simulation_section(doc),)), out.width)))
    _print_tail_advice(plan, doc)
    err.print(f"wrote {target}")


@app.command()
def observe(
    out_dir: Path = typer.Argument(..., help="OUT directory of a deployed plan (plan.json, router/routing.json with endpoints)"),
    window: str = typer.Option("10m", "--window", help="how long to sample, e.g. 10m, 600s"),
    interval: str = typer.Option("15s", "--interval", help="seconds between scrapes"),
    router_url: Optional[str] = typer.Option(None, "--router", help="the router's base URL (its /metrics gives per-workload rates)"),
    previous: Optional[Path] = typer.Option(None, "--previous", help="an earlier observed.yaml: corrections are smoothed against it"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="where to write it (default OUT/observed.yaml)"),
) -> None:
    """Sample the router's and every replica's /metrics over a window; write observed.yaml (rates, lengths,
    latencies, step-time corrections against the plan's model)."""
    from hetcompile.ir.units import parse_duration
    from hetcompile.observe.run import dumps_observed, observe_out, read_observed

    try:
        try:
            w, i = parse_duration(window), parse_duration(interval)
        except ValueError as exc:
            raise HetcompileError(f"--window / --interval: {exc}") from None
        if not (w > 0 and i > 0 and i <= w):
            raise HetcompileError(f"--window must be positive and at least --interval, got {window!r} and {interval!r}")
        prev = read_observed(previous) if previous is not None else None
        err.print(f"observing {out_dir} for {w:g} s (a scrape every {i:g} s)")
        doc = observe_out(out_dir, w, i, router_url, previous=prev)
    except HetcompileError as exc:
        _fail(exc)
        return
    base = out_dir if out_dir.is_dir() else out_dir.parent
    target = output or base / "observed.yaml"
    target.write_text(dumps_observed(doc))
    for wl in doc.workloads:
        rate = f"{wl.rate_per_s:.4g} req/s" if wl.rate_per_s is not None else "rate unknown"
        lens = (f", {wl.input_tokens.mean:.0f} in / {wl.output_tokens.mean:.0f} out tokens"
                if wl.input_tokens and wl.output_tokens else "")
        out.print(f"{wl.name}: {rate}{lens}")
    for c in doc.corrections:
        out.print(f"{c.gpu} TP{c.tp}: steps take {c.factor:.3g}x the model's ({c.tokens} intervals on {', '.join(c.replicas)})")
    for m in doc.missing:
        err.print(f"missing: {m}")
    err.print(f"wrote {target}")


@app.command()
def autopilot(
    out_dir: Path = typer.Argument(..., help="OUT directory of a deployed plan"),
    spec: Path = typer.Option(..., "--spec", help="the spec OUT was built from (its models, GPUs, budget and SLOs)"),
    window: str = typer.Option("10m", "--window", help="each cycle observes this long"),
    interval: str = typer.Option("15s", "--interval", help="seconds between scrapes"),
    router_url: Optional[str] = typer.Option(None, "--router", help="the router's base URL (per-workload rates)"),
    cycles: int = typer.Option(0, "--cycles", min=0, help="stop after this many cycles (0: run until interrupted)"),
    dead_band: str = typer.Option("15%", "--dead-band", help="drift in a rate, a length or a step-time correction that counts as a change"),
    min_interval: str = typer.Option("30m", "--min-interval", help="the least time between two changes of the fleet"),
    churn_penalty: str = typer.Option("5%", "--churn-penalty", help="what each replica launched or torn down costs a replan"),
    dry_run: bool = typer.Option(False, "--dry-run", help="observe and decide; build the new plan beside OUT, deploy nothing"),
) -> None:
    """The closed loop: observe the fleet, replan when it drifted past the dead band, deploy; one line per
    cycle in OUT/autopilot.log (docs/observe.md)."""
    import subprocess

    from hetcompile.autopilot import Autopilot, Damping
    from hetcompile.backends.emit import write
    from hetcompile.driver import compile_spec
    from hetcompile.explain.pictures import pictures
    from hetcompile.ir import units
    from hetcompile.observe.run import observe_out

    try:
        try:
            w, i, gap = units.parse_duration(window), units.parse_duration(interval), units.parse_duration(min_interval)
            band, churn = units.parse_fraction(dead_band), units.parse_fraction(churn_penalty)
        except ValueError as exc:
            raise HetcompileError(f"autopilot option: {exc}") from None
        if not (w > 0 and 0 < i <= w and gap >= 0 and 0 <= band < 1 and 0 <= churn <= 1):
            raise HetcompileError("autopilot options out of range: --window > 0, 0 < --interval <= --window, "
                                  "--min-interval >= 0, --dead-band in [0, 100%), --churn-penalty in [0, 100%]")

        def build_fn(spec_path: Path, obs, previous: Path, out: Path, churn_share: float) -> None:
            res = compile_spec(spec_path, previous=previous, churn_penalty=churn_share, observed=obs,
                               workers=min(4, os.cpu_count() or 1))
            write(res.ir, out, pictures)

        def deploy_fn(out: Path) -> int:
            return subprocess.run([sys.executable, "-c", "from hetcompile.cli import main; main()", "deploy", str(out)]).returncode

        pilot = Autopilot(out_dir, spec, lambda prev: observe_out(out_dir, w, i, router_url, previous=prev), build_fn, deploy_fn,
                          Damping(band, gap, churn), dry_run=dry_run)
        n = 0
        while cycles == 0 or n < cycles:
            out.print(pilot.cycle(), markup=False)
            n += 1
    except HetcompileError as exc:
        _fail(exc)
        return
    except KeyboardInterrupt:
        err.print("autopilot: stopped")


def _parse_stages(text: str, parse_duration) -> list[tuple[float, float]]:
    """'0.4:600s,1.0:10min' -> [(0.4, 600.0), (1.0, 600.0)]; a clear error for anything else."""
    steps = []
    for item in text.split(","):
        load_s, sep, dur_s = item.strip().partition(":")
        try:
            if not sep:
                raise ValueError("expected LOAD:DURATION")
            load_v, dur_v = float(load_s.strip().rstrip("x")), parse_duration(dur_s.strip())
        except ValueError as exc:
            raise HetcompileError(f"--stages: {item.strip()!r}: {exc} (e.g. '0.4:600s,1.0:600s')") from None
        if not (load_v > 0 and dur_v > 0):
            raise HetcompileError(f"--stages: {item.strip()!r}: the load and the duration must be positive")
        steps.append((load_v, dur_v))
    return steps


def _print_tail_advice(plan, doc) -> None:
    """How long a run must be for the p99 it printed (simulate/tail.py), and where this one fell short."""
    from hetcompile.simulate.tail import tail_advice

    advice = tail_advice(plan, doc)
    out.print(advice.statement(), markup=False, soft_wrap=True)
    for w in advice.warnings:
        err.print(f"warning: {w}", markup=False, soft_wrap=True)


def main() -> None:
    """The console entry point: user errors were printed by the commands; anything else is a bug
    or an environment problem (a disk full, a directory not writable) and prints one line too,
    with the traceback only under --debug."""
    try:
        app()
    except SystemExit:
        raise
    except HetcompileError as exc:
        if "--debug" in sys.argv:
            raise
        err.print(str(exc), markup=False)
        sys.exit(exc.exit_code)
    except OSError as exc:
        if "--debug" in sys.argv:
            raise
        err.print(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), markup=False)
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
        if "--debug" in sys.argv:
            raise
        err.print(f"internal error: {type(exc).__name__}: {exc}\n(a bug in hetcompile: rerun with --debug for the traceback "
                  "and report it)", markup=False)
        sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":
    main()
