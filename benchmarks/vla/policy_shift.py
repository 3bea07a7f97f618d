"""How far RL moved a VLA's greedy actions from a reference policy, on the states RL visited.

    python -m benchmarks.vla.policy_shift --ref runs/vla_metaworld_mt10_sft1/checkpoints/last.ckpt \
        --states runs/vla_mt10_rl_sil/checkpoints/last.ckpt \
        --ckpt rl=runs/vla_mt10_rl_sil/checkpoints/last.ckpt

A success rate that does not move can hide a policy that did (its changes do not matter for
success) or one that did not (its steps were too small to change an argmax). This tells which: on
``--n`` states drawn from the self-imitation buffer of ``--states`` (a checkpoint of a run with
``--model.sil_steps``: the states of its successful episodes, tasks drawn uniformly), it compares
each policy's argmax bin per action token with the reference's, and the entropy of the untempered
token distributions. Prints one line per policy; ``--out`` also writes them as JSON.
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.vla.eval import default_label, split_spec
from fastlight.checkpoints import read_checkpoint
from fastlight.modules.loading import load_module
from fastlight.vla.module import SIL_CHECKPOINT_KEY
from fastlight.vla.policy import VLAPolicy
from fastlight.vla.self_imitation import SuccessBuffer


def load_policy(path: str, flag: str) -> VLAPolicy:
    """The ``VLAPolicy`` of a VLA (RL or SFT) checkpoint, in eval mode on the CPU."""
    policy = load_module(path, flag=flag).policy
    if not isinstance(policy, VLAPolicy):
        raise SystemExit(f"{flag} {path}: not a VLA checkpoint (its policy is a {type(policy).__name__})")
    return policy.eval()


def states_of(path: str, n: int, seed: int) -> dict[str, torch.Tensor]:
    ckpt = read_checkpoint(path, flag="--states")
    if SIL_CHECKPOINT_KEY not in ckpt:
        raise SystemExit(
            f"--states {path}: no self-imitation buffer in it (a run with --model.sil_steps > 0)"
        )
    buf = SuccessBuffer(capacity=10**9)
    buf.load_state_dict(ckpt[SIL_CHECKPOINT_KEY])
    obs, _, _ = buf.sample(n, generator=torch.Generator().manual_seed(seed))
    return obs


@torch.no_grad()
def shift(ref: torch.nn.Module, policy: torch.nn.Module, obs: dict[str, torch.Tensor]) -> dict[str, object]:
    """Argmax changes per action dimension and mean entropies (nats per token, temperature 1)."""
    ref_logits, logits = ref(obs)[0], policy(obs)[0]  # [N, K, bins]
    a, b = ref_logits.argmax(-1), logits.argmax(-1)
    dist = (b - a).abs().float()
    ent = torch.distributions.Categorical(logits=logits).entropy().mean()
    ref_ent = torch.distributions.Categorical(logits=ref_logits).entropy().mean()
    return {
        "changed": float((a != b).float().mean()),
        "changed_per_dim": [round(v, 3) for v in (a != b).float().mean(0).tolist()],
        "changed_by_more_than_2_bins": float((dist > 2).float().mean()),
        "mean_abs_bin_shift_per_dim": [round(v, 2) for v in dist.mean(0).tolist()],
        "entropy": float(ent),
        "ref_entropy": float(ref_ent),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ref", required=True, help="the reference checkpoint (e.g. the SFT run's)")
    parser.add_argument(
        "--states", required=True, help="a checkpoint whose self-imitation buffer gives the states"
    )
    parser.add_argument("--ckpt", action="append", required=True, metavar="[LABEL=]PATH")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the results as JSON here")
    a = parser.parse_args(argv)
    obs = states_of(a.states, a.n, a.seed)
    ref = load_policy(a.ref, "--ref")
    results = {}
    for spec in a.ckpt:
        label, path = split_spec(spec)
        label = label or default_label(path)
        r = shift(ref, load_policy(path, "--ckpt"), obs)
        results[label] = {"path": path, **r}
        print(
            f"{label}: argmax changed on {r['changed']:.1%} of tokens (per dim {r['changed_per_dim']}), "
            f"by > 2 bins on {r['changed_by_more_than_2_bins']:.1%}; mean |shift| per dim "
            f"{r['mean_abs_bin_shift_per_dim']} bins; entropy {r['entropy']:.2f} nats/token "
            f"(reference {r['ref_entropy']:.2f})",
            flush=True,
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(
                {"ref": a.ref, "states": a.states, "n": a.n, "seed": a.seed, "policies": results}, f, indent=1
            )


if __name__ == "__main__":
    main()
