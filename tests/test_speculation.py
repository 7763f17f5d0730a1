"""Speculative decoding is lossless and reports every step truthfully."""
import pytest
import torch
from conftest import DEVICES, assert_all_free, run_engine

from backend import Finished, Request, SamplingParams, SpecConfig, Step, load_engine
from backend.speculation import SpecDecodingStats, propose_ngram, verify
from tiny_models import build_mtp_checkpoint

# (base config, MTP depths, chain norm, sliding depths)
MTP_VARIANTS = {
    "two_depths": ("logscale_mixed", 2, False, ()),
    "three_depths_chain": ("default_pattern_dense", 3, True, ()),
    "three_depths_chain_sliding": ("default_pattern_dense", 3, True, (1,)),
}
LOOPY_PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]


@pytest.fixture(scope="module")
def mtp_models(tmp_path_factory):
    built = {}
    for name, (base, depths, chain, local) in MTP_VARIANTS.items():
        path = tmp_path_factory.mktemp(name)
        built[name] = (path, build_mtp_checkpoint(path, base, depths, chain, local, seed=len(built)))
    return built


def make_copying_mtp(engine):
    """Turn the engine's MTP depths into 'repeat the backbone's own guess' heads: blocks add nothing and
    the projection passes the hidden state through, so each draft is the backbone's prediction one
    position back. On a random model that loops, such drafts are often right and often wrong, which is
    what the rollback paths need."""
    hidden = engine.config.hidden_size
    for depth in engine.mtp.depths:
        depth.input_proj.zero_()
        depth.input_proj[:, :hidden] = torch.eye(hidden) if depth.hidden_first else 0
        if not depth.hidden_first:
            depth.input_proj[:, hidden:] = torch.eye(hidden)
        depth.block.attn.wo.zero_()
        depth.block.mlp.down.zero_()
    return engine


def greedy(engine, prompt, max_tokens, spec=None, request_id="r"):
    req = Request(prompt_ids=prompt, sampling=SamplingParams(max_tokens=max_tokens), request_id=request_id, spec=spec)
    return run_engine(engine, [req])[request_id]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", list(MTP_VARIANTS))
def test_greedy_output_is_unchanged_by_speculation(mtp_models, variant, device):
    path, _ = mtp_models[variant]
    engine = make_copying_mtp(load_engine(str(path), device=device, max_batched_tokens=64))
    prompts = [LOOPY_PROMPT, list(range(20, 90)), [3] * 5, list(range(150, 100, -1))]
    base = {i: greedy(engine, p, 48, request_id=f"b{i}")[0] for i, p in enumerate(prompts)}
    accepted_somewhere = False
    for spec in [SpecConfig("mtp", k) for k in range(1, 9)] + [SpecConfig("ngram", k) for k in (1, 3, 8)]:
        for i, p in enumerate(prompts):   # alone
            tokens, events = greedy(engine, p, 48, spec, request_id=f"s{i}")
            assert isinstance(events[-1], Finished) and tokens == base[i], (spec, i)
            accepted_somewhere |= events[-1].spec_summary["num_accepted_tokens"] > 0
        # batched, joining at different steps
        requests = [Request(prompt_ids=p, sampling=SamplingParams(max_tokens=48), request_id=f"x{i}", spec=spec)
                    for i, p in enumerate(prompts)]
        out = run_engine(engine, requests, [0, 1, 3, 4])
        for i in range(len(prompts)):
            assert out[f"x{i}"][0] == base[i], (spec, "batched", i)
    assert accepted_somewhere
    assert_all_free(engine)


def test_mixed_methods_in_one_batch(mtp_models):
    path, _ = mtp_models["two_depths"]
    engine = make_copying_mtp(load_engine(str(path)))
    base = greedy(engine, LOOPY_PROMPT, 40)[0]
    specs = [None, SpecConfig("mtp", 2), SpecConfig("mtp", 7), SpecConfig("ngram", 4), SpecConfig("none")]
    requests = [Request(prompt_ids=LOOPY_PROMPT, sampling=SamplingParams(max_tokens=40), request_id=f"m{i}",
                        spec=s) for i, s in enumerate(specs)]
    out = run_engine(engine, requests, [0, 0, 2, 5, 5])
    for i in range(len(specs)):
        assert out[f"m{i}"][0] == base
    assert_all_free(engine)


def test_draft_logits_equal_transformers_mtp_module(mtp_models):
    """With transformers' embedding convention and k = number of depths, every round's draft logits
    equal those MtpModel computes inside generate(use_mtp=True). Sliding depths are left out: there
    MtpModel masks causally without a window in its first pass and relies on its cache's length after
    (create_masks_for_mtp_layer maps "hybrid_sliding" to a causal mask), which no windowed layer matches."""
    from transformers.modeling_layers import MtpModel
    for variant, (path, model) in mtp_models.items():
        if MTP_VARIANTS[variant][3]:
            continue
        depths = MTP_VARIANTS[variant][1]
        captured = []
        forward = MtpModel.forward

        def capture(self, *args, **kwargs):
            ids, logits, loss = forward(self, *args, **kwargs)
            captured.append(logits[0].float())
            return ids, logits, loss
        MtpModel.forward = capture
        try:
            prompt = list(range(30, 70))
            with torch.no_grad():
                model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, use_mtp=True)
        finally:
            MtpModel.forward = forward
        engine = load_engine(str(path))
        ours = []
        propose = engine.runner.propose_mtp

        def record(steps, hidden):
            drafts = propose(steps, hidden)
            ours.extend(d.logits for d in drafts.values())
            return drafts
        engine.runner.propose_mtp = record
        greedy(engine, prompt, 40, SpecConfig("mtp", depths, mtp_embedding="transformers"))
        rounds = min(len(ours), len(captured)) - 1
        assert rounds >= 10
        for r in range(rounds):
            torch.testing.assert_close(ours[r], captured[r], atol=1e-4, rtol=0, msg=f"{variant} round {r}")


def test_caches_after_many_rejections_equal_a_run_without_speculation(mtp_models):
    """Record, at every verification, the target logits for the last committed token; they must equal
    the plain run's logits at the same position: KV blocks, conv states and windows rolled back exactly."""
    path, _ = mtp_models["three_depths_chain_sliding"]
    engine = make_copying_mtp(load_engine(str(path)))

    def logits_by_position(spec):
        seen = {}
        execute = engine.runner.execute

        def capture(scheduled):
            hidden, logits = execute(scheduled)
            for item in scheduled:
                if item.samples:
                    seen[len(item.seq.token_ids) - 1] = logits[item.seq.request_id][0]
            return hidden, logits
        engine.runner.execute = capture
        try:
            tokens, events = greedy(engine, LOOPY_PROMPT + list(range(40, 60)), 120, spec)
        finally:
            engine.runner.execute = execute
        return seen, events
    plain, _ = logits_by_position(None)
    spec, events = logits_by_position(SpecConfig("mtp", 5))
    summary = events[-1].spec_summary
    assert summary["num_draft_tokens"] - summary["num_accepted_tokens"] > 50   # many rejections
    assert summary["num_accepted_tokens"] >= 5     # and some acceptances
    assert len(spec) > 20
    for position, row in spec.items():
        torch.testing.assert_close(row, plain[position], atol=1e-5, rtol=0, msg=f"position {position}")


def test_accounting_matches_the_steps(mtp_models):
    path, _ = mtp_models["two_depths"]
    engine = make_copying_mtp(load_engine(str(path)))
    tokens, events = greedy(engine, LOOPY_PROMPT, 80, SpecConfig("mtp", 4))
    steps = [e for e in events if isinstance(e, Step)]
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert sum(len(s.emitted) for s in steps) == finished.usage["completion_tokens"] == len(tokens) == 80
    summary = finished.spec_summary
    with_drafts = [s for s in steps if s.drafted]
    assert summary["num_drafts"] == len(with_drafts)
    assert summary["num_draft_tokens"] == sum(len(s.drafted) for s in steps)
    assert summary["num_accepted_tokens"] == sum(s.accepted for s in steps)
    for i, count in enumerate(summary["num_accepted_tokens_per_pos"]):
        assert count == sum(1 for s in steps if s.accepted > i)
    assert summary["accepted_histogram"] == [sum(1 for s in with_drafts if s.accepted == a)
                                             for a in range(len(summary["accepted_histogram"]))]
    assert summary["mean_acceptance_length"] == pytest.approx(1 + summary["num_accepted_tokens"] / len(with_drafts))
    for s in steps:
        assert s.emitted[:s.accepted] == s.drafted[:s.accepted]
        assert len(s.emitted) <= s.accepted + 1


def chi_square_p(counts_a: dict, counts_b: dict) -> float:
    from scipy.stats import chi2_contingency
    keys = sorted(set(counts_a) | set(counts_b))
    table = [[counts_a.get(k, 0) for k in keys], [counts_b.get(k, 0) for k in keys]]
    return chi2_contingency(table)[1]


def second_token_counts(engine, spec, n, monkeypatch=None):
    sampling = lambda seed: SamplingParams(temperature=1.0, top_k=6, max_tokens=3, seed=seed)  # noqa: E731
    requests = [Request(prompt_ids=LOOPY_PROMPT, sampling=sampling(seed), request_id=f"t{seed}", spec=spec)
                for seed in range(n)]
    counts = {}
    for chunk in range(0, n, 16):
        out = run_engine(engine, requests[chunk:chunk + 16])
        for r in requests[chunk:chunk + 16]:
            token = out[r.request_id][0][1]
            counts[token] = counts.get(token, 0) + 1
    return counts


def test_sampling_stays_lossless_and_a_wrong_rule_is_caught(mtp_models, monkeypatch):
    """The second token (the first one verified against a draft) follows the same distribution with
    and without speculation (chi-square over 1200 seeded samples each); accepting every draft
    instead fails the same test."""
    import backend.engine as engine_module
    path, _ = mtp_models["two_depths"]
    engine = load_engine(str(path))
    plain = second_token_counts(engine, None, 1200)
    spec = second_token_counts(engine, SpecConfig("mtp", 2), 1200)
    assert chi_square_p(plain, spec) > 1e-3
    wrong_verify = lambda *a, **k: verify(*a, **k, accept_rule=lambda p, q, d, g: True)  # noqa: E731
    monkeypatch.setattr(engine_module, "verify", wrong_verify)
    wrong = second_token_counts(engine, SpecConfig("mtp", 2), 1200)
    assert chi_square_p(plain, wrong) < 1e-6


def test_verify_rule_by_hand():
    logits = torch.tensor([[0.0, 5.0, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    greedy_params = SamplingParams()
    gen = torch.Generator().manual_seed(0)
    assert verify(logits, [1, 0], None, greedy_params, gen) == ([1, 0, 2], 2)     # all accepted + bonus
    assert verify(logits, [1, 2], None, greedy_params, gen) == ([1, 0], 1)        # broke at 2, target says 0
    assert verify(logits, [2, 0], None, greedy_params, gen) == ([1], 0)
    assert verify(logits[:1], [], None, greedy_params, gen) == ([1], 0)


def test_ngram_proposals():
    assert propose_ngram([1, 2, 3, 4, 1, 2], 2) == [3, 4]
    assert propose_ngram([1, 2, 3, 1, 2, 3, 1, 2], 3) == [3, 1, 2]
    assert propose_ngram([7, 7, 7, 7], 3) == [7, 7, 7]
    assert propose_ngram([1, 2, 3], 2) == []
    assert propose_ngram([5, 1, 2, 9, 9, 9, 1, 2], 2, min_n=2, max_n=2) == [9, 9]


def test_stats_definitions():
    stats = SpecDecodingStats()
    for drafted, accepted in [(3, 3), (3, 1), (3, 0), (2, 2)]:
        stats.observe(drafted, accepted)
    d = stats.to_dict()
    assert d["num_drafts"] == 4 and d["num_draft_tokens"] == 11 and d["num_accepted_tokens"] == 6
    assert d["mean_acceptance_length"] == pytest.approx(1 + 6 / 4)
    assert d["num_accepted_tokens_per_pos"] == [3, 2, 1]
    assert d["unconditional_acceptance_per_pos"] == [3 / 4, 2 / 4, 1 / 3]
    assert d["conditional_acceptance_per_pos"] == [3 / 4, 2 / 3, 1 / 2]
    assert d["accepted_histogram"] == [1, 1, 1, 1]


def test_mtp_on_a_checkpoint_without_heads_is_refused_clearly(checkpoints):
    from backend import Error
    path, _ = checkpoints("moe_only")
    engine = load_engine(str(path))
    assert engine.capabilities["spec_methods"] == ["none", "ngram"]
    events = engine.add_request(Request(prompt_ids=[1, 2], spec=SpecConfig("mtp", 3)))
    assert isinstance(events[0], Error) and "no MTP draft heads" in events[0].message
    with pytest.raises(ValueError, match="no MTP draft heads"):
        load_engine(str(path), spec=SpecConfig("mtp", 3))


def test_shipped_model_runs_every_method_from_the_cli():
    import json
    import subprocess
    import sys
    outputs = {}
    for method in ("none", "ngram", "mtp"):
        result = subprocess.run([sys.executable, "-m", "backend", "generate", "--model", "assets/inkling-tiny",
                                 "--prompt", "Count: 1 2 3 1 2 3 1 2", "--max-tokens", "24", "--spec", method,
                                 "--num-spec-tokens", "4", "--json"], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        outputs[method] = json.loads(result.stdout)
    assert outputs["none"]["token_ids"] == outputs["ngram"]["token_ids"] == outputs["mtp"]["token_ids"]
    summary = outputs["mtp"]["summary"]
    assert summary["method"] == "mtp" and summary["num_draft_tokens"] > 0 and summary["tokens_per_s"] > 0
    for key in ("mean_acceptance_length", "acceptance_rate", "num_accepted_tokens_per_pos",
                "conditional_acceptance_per_pos", "unconditional_acceptance_per_pos", "accepted_histogram"):
        assert key in summary
    assert any(step["drafted"] for step in outputs["mtp"]["steps"])
