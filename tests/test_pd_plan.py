"""Prefill/decode disaggregation through the whole pipeline (issue 35): `disaggregation: auto` in a
spec, compose's groups as replicas with roles, the routing table's groups, the simulator's two-step
flow, verification, and plan.json / plan.md beside the plan without groups. The two examples are
built once per session (conftest.build)."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, build
from hetcompile.errors import SpecError
from hetcompile.ir.document import plan_doc
from hetcompile.simulate.run import poisson_arrivals, replay
from hetcompile.simulate.verify import part_of

PD_RAG = ROOT / "examples" / "pd-rag" / "spec.yaml"
PD_CHAT = ROOT / "examples" / "pd-chat" / "spec.yaml"


def test_long_prompts_at_a_tight_tpot_get_a_group_of_prefill_and_decode_replicas() -> None:
    ir = build(PD_RAG).ir
    groups = ir.routing.groups
    assert [g.id for g in groups] == ["rag-pd0"]  # rag's 8k prompts split; chat's 512 do not
    reps = {r.id: r for r in ir.replicas}
    g = groups[0]
    assert {reps[x.replica].role for x in g.prefill} == {"prefill"} and {reps[x.replica].role for x in g.decode} == {"decode"}
    assert all(reps[x.replica].group == g.id for x in (*g.prefill, *g.decode))
    # the class routes whole requests to the group (never to a phase replica), aggregated replicas beside it
    rag = next(c for m in ir.routing.models for c in m.classes if c.name == "rag")
    assert g.id in {w.replica for w in rag.weights}
    assert not {w.replica for w in rag.weights} & {r for r, x in reps.items() if x.role is not None}
    # the decode replica runs with the C* its TPOT target allows, in the routing table and on the command line
    for x in g.decode:
        routed = next(r for r in ir.routing.replicas if r.id == x.replica)
        assert routed.role == "decode" and routed.max_num_seqs == reps[x.replica].max_num_seqs < ir.engine.max_num_seqs
    doc = plan_doc(ir)
    assert doc.groups is not None and doc.groups[0].transfer_s > 0
    # plan.json's routing names the group's decode replicas with the group's share
    assert sum(doc.routing["rag"][d] for d in doc.groups[0].decode) == pytest.approx(
        next(w.weight for w in rag.weights if w.replica == g.id), abs=1e-5)


def test_the_split_is_verified_and_weighed_against_the_plan_without_groups() -> None:
    ir = build(PD_RAG).ir
    assert ir.verification is not None and all(w.met for w in ir.verification.workloads)
    alt = ir.aggregated
    assert alt is not None and alt.verified
    doc = plan_doc(ir)
    assert alt.price_per_hour <= ir.budget_per_s * 3600 + 1e-6
    assert doc.totals.scale > alt.scale  # what the split buys at the same budget
    assert {w.name for w in alt.workloads} == {"chat", "rag"} and all(w.met for w in alt.workloads)


def test_plan_md_shows_the_groups_and_the_plan_without_them(example_artifacts) -> None:
    md = example_artifacts("pd-rag")["plan.md"]
    assert "## Prefill/decode disaggregation" in md and "==KV " in md
    assert "| rag-pd0 | rag |" in md and "without groups" in md
    assert "(prefill)" in md and "(decode)" in md  # the replicas table names each replica's role
    routing = json.loads(example_artifacts("pd-rag")["router/routing.json"])
    assert [g["id"] for g in routing["groups"]] == ["rag-pd0"]


def test_short_prompts_get_no_group_and_the_plan_says_compose_weighed_them(example_artifacts) -> None:
    ir = build(PD_CHAT).ir
    assert not ir.routing.groups and all(r.role is None for r in ir.replicas) and ir.aggregated is None
    note = next(p for p in ir.reports if p.name == "disaggregation").notes[0]
    assert note.startswith("compose weighed ") and "took none" in note
    assert "## Prefill/decode disaggregation" not in example_artifacts("pd-chat")["plan.md"]
    assert "groups" not in json.loads(example_artifacts("pd-chat")["router/routing.json"])


def test_the_simulator_prefills_a_group_request_then_moves_it_to_decode() -> None:
    doc = plan_doc(build(PD_RAG).ir)
    g = doc.groups[0]
    part = part_of(doc, {"rag"})
    assert set(g.prefill) <= {r.id for r in part.replicas}  # reached only through the group, kept all the same
    requests, sims = replay(part, poisson_arrivals(part, 60.0, 0), 60.0)
    rag = [r for r in requests if r.workload == "rag" and r.finish is not None]
    split = [r for r in rag if r.replica in g.decode]
    assert split and all(r.prefilled_on in g.prefill for r in split)
    assert all(r.first_token - r.arrival >= g.transfer_s for r in split)  # the KV crossed the link first
    assert all(r.prefilled_on == "" for r in rag if r.replica not in g.decode)
    busy = {s.id: s.completed for s in sims}
    assert all(busy[p] > 0 for p in g.prefill)  # every prefill replica ran prompts


def test_disaggregation_with_mixed_pipelines_is_a_spec_error_at_its_line(tmp_path) -> None:
    from hetcompile.driver import compile_spec

    text = PD_CHAT.read_text() + "placement: {pipelines: mixed}\n"
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    with pytest.raises(SpecError) as e:
        compile_spec(spec, stop_after="profile")
    line = next(i for i, l in enumerate(text.splitlines(), 1) if l.startswith("disaggregation:"))
    assert e.value.span is not None and e.value.span.line == line
    assert "pipelines: single-type" in str(e.value)


def test_phase_replicas_lower_to_nixl_connector_flags_env_and_setup(example_artifacts) -> None:
    import shlex

    import yaml

    from hetcompile.backends.vllm_flags import check_serve_argv, serve_argv_from_script

    files = example_artifacts("pd-rag")
    plan = json.loads(files["plan.json"])
    for r in plan["replicas"]:
        script = files[f"vllm/{r['id']}/node0.sh"]
        [argv] = serve_argv_from_script(script)
        assert check_serve_argv(argv) == []  # every flag, the kv-transfer-config included, exists in vLLM 0.33
        task = yaml.safe_load(files[f"sky/{r['id']}.yaml"])
        if r.get("role") is None:  # whole requests: nothing of P/D on its command line, in its env or setup
            assert "--kv-transfer-config" not in argv and "VLLM_NIXL" not in script and "setup" not in task
            continue
        line = next(x for x in script.splitlines() if "--kv-transfer-config" in x).rstrip(" \\")
        words = shlex.split(line)  # the shell word the script passes: JSON, quoted once
        config = json.loads(words[words.index("--kv-transfer-config") + 1])
        assert config == {"kv_connector": "NixlConnector", "kv_role": {"prefill": "kv_producer", "decode": "kv_consumer"}[r["role"]],
                          "kv_load_failure_policy": "fail"}
        assert argv[argv.index("--block-size") + 1] == "16"  # both sides pin the block size their handshake compares
        assert "VLLM_NIXL_SIDE_CHANNEL_HOST" in script and "UCX_TLS" in script
        assert "nixl" in task["setup"]
        seqs = int(argv[argv.index("--max-num-seqs") + 1])
        assert seqs == (r["workloads"]["rag"]["concurrency"] if r["role"] == "decode" else plan["engine"]["max_num_seqs"])


def test_explain_shows_each_group_and_the_plan_without_groups() -> None:
    from hetcompile.explain.explain import explain_plan as explain
    from hetcompile.explain.render import render_explanation

    doc = plan_doc(build(PD_RAG).ir)
    e = explain(doc)
    assert e.disaggregation[0].startswith("rag --> [prefill ") and "==KV " in e.disaggregation[0]
    assert e.disaggregation[1].startswith("with groups: ") and "without: " in e.disaggregation[1]
    assert "Prefill/decode disaggregation" in render_explanation(e, "md")
    assert "disaggregation" in json.loads(render_explanation(e, "json"))
    plain = explain(plan_doc(build(PD_CHAT).ir))
    assert plain.disaggregation == () and "disaggregation" not in json.loads(render_explanation(plain, "json"))


def test_a_group_on_aws_says_which_ports_the_user_must_open() -> None:
    notes = next(p for p in build(PD_RAG).ir.reports if p.name == "disaggregation").notes
    assert any(n.startswith("AWS: before rag-pd0 can move KV") and "5600" in n for n in notes)


def test_a_bare_off_is_the_word_not_yaml_false(tmp_path) -> None:
    from hetcompile.driver import compile_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text(PD_CHAT.read_text().replace("disaggregation: auto", "disaggregation: off"))  # YAML 1.1: false
    ir = compile_spec(spec, stop_after="profile").ir
    assert not ir.disaggregation and not any(s.role for s in ir.shapes)


def test_a_rollout_into_groups_writes_only_the_new_plans_own_table() -> None:
    from hetcompile.migrate.actions import RolloutError, refuse_group_step

    pd = plan_doc(build(PD_RAG).ir)
    plain = plan_doc(build(PD_CHAT).ir)
    refuse_group_step(plain, plain, 3, final=False)  # no groups on either side: any table
    refuse_group_step(plain, pd, 7, final=True)  # the new plan's own table knows its groups
    with pytest.raises(RolloutError, match="into prefill/decode groups"):
        refuse_group_step(plain, pd, 2, final=False)
    with pytest.raises(RolloutError, match="out of prefill/decode groups"):
        refuse_group_step(pd, plain, 2, final=False)
