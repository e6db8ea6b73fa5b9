"""The correctness phase of a run, in three steps that can start early: the worker's side of
every case is sent ahead (``send``: it computes while this process compiles and warms its own
side), this process's side and the fp32 reference run while it waits for the worker
(``own``), and the scores come last (``finish``), with the timed runs' answers. Nothing here is
timed. Each case's prompt is a function of the run's seed and the case's name alone
(``case_seed``): the same run gives the same cases, whatever ran before the check was made
(the timed runs' prompts, drawn from the OS, are what no process can know ahead)."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import torch

from tilegym_hf_bench.generation import Generator, make_input_ids
from tilegym_hf_bench.model_factory import fp32_reference
from tilegym_hf_bench.modes import EAGER
from tilegym_hf_bench.remote_side import RemoteSide
from tilegym_hf_bench.routing import Margins, Referee, Routed, routing_block, routing_line
from tilegym_hf_bench.routing_report import generate_reporting as reporting
from tilegym_hf_bench.scoring import (
    Case,
    CaseScore,
    agreement,
    agreement_problem,
    cases,
    drift,
    finite_or_none,
    left_pad_mask,
    timed_output_agreement,
    token_errors,
    worst,
)

BASELINE, CUTILE = "baseline", "cutile"


def case_seed(run_seed: int, case_name: str) -> int:
    """The seed of one case's prompt. Drawn from the OS, the prompts changed every run, and
    whether a tiny random MoE's near-tied router flipped an expert on one side only (a token's
    error 0.027 against the baseline's 0.006 on tiny-qwen3_moe) passed or failed a run by
    chance. A digest, not ``hash()``, so no process's hash seed moves it."""
    digest = hashlib.sha256(f"correctness/{run_seed}/{case_name}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def case_inputs(case: Case, vocab: int, run_seed: int):
    """(prompt ids, attention mask or None) of one correctness case of the run seeded with
    ``run_seed``."""
    ids = make_input_ids(
        vocab, case.batch, case.input_length, case_seed(run_seed, case.name), "cpu"
    )
    mask = left_pad_mask(case.batch, case.input_length) if case.padded else None
    if mask is not None:
        ids = ids.masked_fill(mask == 0, 0)
    return ids, mask


def generate_case(gen: Generator, case: Case, ids, mask):
    """(sequences, logits, routing report or None) of one local side on one correctness case,
    the report recorded by that same generate() (``routing_report``); the generator's own
    prompt is left as it was (its warm-up and timed runs go on from it)."""
    if case.timed_path:
        prompt, prompt_mask = gen.input_ids, gen.attention_mask
        gen.use_prompt(ids.to(gen.device), None)
        try:
            return _reported(gen, ids, case.new_tokens)
        finally:
            gen.use_prompt(prompt, prompt_mask)
    eager = Generator(gen.model, ids.to(gen.device), gen.device, EAGER)
    eager.use_prompt(ids.to(gen.device), None if mask is None else mask.to(gen.device))
    return _reported(eager, ids, case.new_tokens)


def _reported(gen: Generator, ids, new_tokens: int):
    generate = functools.partial(gen.generate_with_logits, new_tokens)
    return reporting(gen.model, generate, *ids.shape, new_tokens)


def start_remote_case(remote: RemoteSide, case: Case, ids, mask):
    """Ask the worker for one case and return at once: the returned function waits for it and
    reads its answer (sequences, logits, routing report or None). The remote side's prompt is
    left as it was."""
    prompt, prompt_mask = remote.prompt, remote.mask
    remote.use_prompt(ids, None if case.timed_path else mask)
    try:
        return remote.start_logits(
            case.new_tokens, mode=None if case.timed_path else EAGER, routing=True
        )
    finally:
        remote.use_prompt(prompt, prompt_mask)


@dataclass
class _Own:
    """This process's side of one case: its sequence, its error and drift along fp32, and the
    reference logits on that sequence (kept: the worker's sequence is usually the same). For an
    MoE model also fp32's routing on that sequence, the near-tie margins measured on it and the
    side's logits, which are scored against the alternate routings once the worker's are in."""

    seq: torch.Tensor
    err: float
    drift: float
    reference: torch.Tensor
    routed: Routed | None = None
    margins: Margins | None = None
    logits: torch.Tensor | None = None
    report: list | None = None


@dataclass
class _Kernel:
    """The worker's side of one case, with the fp32 reference on its sequence."""

    seq: torch.Tensor
    logits: torch.Tensor
    reference: torch.Tensor
    routed: Routed | None
    report: list | None = None


class CorrectnessCheck:
    """One run's correctness: the cases (``scoring.cases``) with their prompts, from the
    run's seed."""

    def __init__(self, wl, vocab: int, log):
        self.wl = wl
        self.log = log
        self.cases = cases(wl.batch_size, wl.input_length, wl.output_length)
        self.inputs = [case_inputs(case, vocab, wl.seed) for case in self.cases]
        self._remote: list | None = None
        self._own: list[_Own] | None = None
        self._ref_model = None
        self._referee: Referee | None = None

    def send(self, cutile) -> None:
        """The worker's side of every case, asked for at once (a local cuTile side, as in the
        CPU tests, is generated in ``finish``). Its first eager runs of new shapes JIT-compile
        kernels: sent ahead, that overlaps this process's work."""
        if self._remote is not None or cutile is None:
            return
        if isinstance(cutile, RemoteSide):
            self._remote = [
                start_remote_case(cutile, case, ids, mask)
                for case, (ids, mask) in zip(self.cases, self.inputs, strict=True)
            ]
        else:
            self._remote = [
                lambda c=case, i=ids, m=mask: generate_case(cutile, c, i, m)
                for case, (ids, mask) in zip(self.cases, self.inputs, strict=True)
            ]

    def own(self, baseline: Generator) -> None:
        """This process's side of every case and the fp32 reference on its sequences (for an
        MoE model with its routing, and the near-tie margins against this side's bf16 model)."""
        if self._own is not None:
            return
        self._ref_model = fp32_reference(baseline.model)
        self._referee = Referee(self._ref_model, baseline.model)
        device = baseline.device
        self._own = []
        for case, (ids, mask) in zip(self.cases, self.inputs, strict=True):
            seq, logits, report = generate_case(baseline, case, ids, mask)
            seq = seq.to(device)
            gpu_mask = None if mask is None else mask.to(device)
            reference, routed = self._referee.plain(seq, case.input_length, gpu_mask)
            logits = logits.to(device)
            err = float(token_errors(logits, reference).max())
            own = _Own(seq, err, drift(logits, reference), reference)
            if routed is not None:
                own.routed, own.logits = routed, logits
                own.margins = self._referee.margins(seq, case.input_length, gpu_mask, routed)
                own.report = report
            self._own.append(own)
            del logits

    def _routing(self, case: Case, own: _Own, mask, kernel: _Kernel | None):
        """(baseline error, kernel error or None, the case's ``routing`` block) of an MoE
        case: each side's tokens scored against fp32 and the alternate routings of its own
        sequence's near-ties (``routing``), one set of forwards where the sequences agree."""

        def scored(seq, reference, routed, sides, reports):
            return self._referee.refereed(
                seq, case.input_length, mask, reference, routed, own.margins.margin, sides, reports
            )

        if kernel is None:
            runs = [scored(own.seq, own.reference, own.routed, [own.logits], [own.report])]
        elif torch.equal(kernel.seq, own.seq):
            both = [own.logits, kernel.logits]
            runs = [scored(own.seq, own.reference, own.routed, both, [own.report, kernel.report])]
        else:
            runs = [
                scored(own.seq, own.reference, own.routed, [own.logits], [own.report]),
                scored(
                    kernel.seq, kernel.reference, kernel.routed, [kernel.logits], [kernel.report]
                ),
            ]
        errors = [side for run in runs for side in run.sides]
        kernel_err = float(errors[1].best.max()) if kernel is not None else None
        block = routing_block(self._referee.moe_layers, own.margins, runs, errors)
        return float(errors[0].best.max()), kernel_err, block

    def finish(self, baseline: Generator, cutile, timed_runs: dict | None = None) -> dict:
        """Score every case (the steps not taken yet are taken now) and the timed answers."""
        self.send(cutile)
        self.own(baseline)
        device = baseline.device
        ref_model = self._ref_model
        scores: list[CaseScore] = []
        for i, (case, (_ids, mask)) in enumerate(zip(self.cases, self.inputs, strict=True)):
            own = self._own[i]
            gpu_mask = None if mask is None else mask.to(device)
            drifts = [own.drift]
            kernel_err = top1 = kernel = None
            base_err, routing = own.err, None
            finite = True
            if self._remote is not None:
                seq, kernel_logits, report = self._remote[i]()
                seq, kernel_logits = seq.to(device), kernel_logits.to(device)
                reference, routed = own.reference, own.routed
                if not torch.equal(seq, own.seq):  # diverged: score it on its own sequence
                    reference, routed = self._referee.plain(seq, case.input_length, gpu_mask)
                finite = bool(torch.isfinite(kernel_logits).all())
                kernel_err = float(token_errors(kernel_logits, reference).max())
                top1 = float(agreement(seq, reference, case.input_length).mean())
                drifts.append(drift(kernel_logits, reference))
                kernel = _Kernel(seq, kernel_logits, reference, routed, report)
                del kernel_logits, reference
            if own.routed is not None:
                base_err, kernel_err, routing = self._routing(case, own, gpu_mask, kernel)
            own.reference = own.logits = kernel = None
            score = CaseScore(case.name, kernel_err, base_err, finite, top1, routing)
            scores.append(score)
            v = score.rule()
            self.log(
                f"correctness case {case.name} ({case.batch} x {case.input_length} -> "
                f"{case.new_tokens}{', left-padded' if case.padded else ''}): "
                f"{'PASS' if v.passed else 'FAIL'}: {v.reason}; bf16 baseline max token rel err "
                f"{base_err:.3e}"
                + (f"; top-1 agreement {top1:.4f}" if top1 is not None else "")
                + "; drift along fp32 "
                + " / ".join(f"{d:+.2e}" for d in drifts)
                + (f"; {routing_line(routing)}" if routing is not None else "")
            )
        chosen = worst(scores)
        rule = chosen.rule()
        passed = all(s.rule().passed for s in scores)
        agreement_block = None
        if cutile is not None and timed_runs and timed_runs.get(CUTILE):
            wl = self.wl
            runs = {
                n: [(seq, wl.input_length) for seq in timed_runs.get(n, [])] for n in timed_runs
            }
            cut = timed_output_agreement(ref_model, runs.get(CUTILE, []))
            base = timed_output_agreement(ref_model, runs.get(BASELINE, []))
            agreement_block = {"baseline": base, "cutile": cut, "runs": len(runs.get(CUTILE, []))}
            problem = agreement_problem(cut, base)
            self.log(
                "timed answers: "
                + (
                    f"FAIL: {problem}"
                    if problem
                    else f"PASS: cuTile chose fp32's token for "
                    f"{cut:.3f} of its generated tokens, PyTorch for "
                    f"{'n/a' if base is None else f'{base:.3f}'}"
                )
            )
            passed = passed and problem is None
        self._ref_model = self._referee = None
        if cutile is None:
            self.log("correctness: PyTorch side only (no cuTile code ran): nothing was judged")
        else:
            self.log(f"correctness: {'PASS' if passed else 'FAIL'} (reported case: {chosen.name})")
        return {
            "passed": passed if cutile is not None else rule.passed,
            "logits_rel_err": finite_or_none(chosen.kernel_err),
            "baseline_rel_err": finite_or_none(chosen.baseline_err),
            "tolerance": rule.tolerance,
            "top1_agreement": chosen.top1,
            "statistic": "max_token",
            "cases": [s.as_json(c) for s, c in zip(scores, self.cases, strict=True)],
            "timed_agreement": agreement_block,
        }


def check_correctness(baseline: Generator, cutile, wl, timed_runs: dict | None = None, log=print):
    """Both sides on every case, scored per generated token against this process's fp32
    reference on each side's own sequence; then the timed runs' answers (all steps at once)."""
    vocab = baseline.model.config.get_text_config().vocab_size
    return CorrectnessCheck(wl, vocab, log).finish(baseline, cutile, timed_runs)
