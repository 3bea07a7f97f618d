"""Objectives as objects: their settings and checks, and how hparams and checkpoints hold them."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from fastlight.losses import gipo_loss, sapo_loss
from fastlight.modules.objectives import GIPO, SAPO, Objective, PPOClip, as_objective
from fastlight.modules.rl_module import RLModule
from fastlight.vla.module import VLAModule


@pytest.mark.parametrize(
    ("make", "line"),
    [
        (lambda: PPOClip(clip_eps=0), "--model.objective.init_args.clip_eps must be > 0, got 0"),
        (lambda: GIPO(sigma=-1), "--model.objective.init_args.sigma must be > 0, got -1"),
        (lambda: GIPO(clip_frac_eps=0.0), "--model.objective.init_args.clip_frac_eps must be > 0, got 0.0"),
        (lambda: SAPO(tau_pos=0), "--model.objective.init_args.tau_pos must be > 0, got 0"),
        (lambda: SAPO(tau_neg=-2.0), "--model.objective.init_args.tau_neg must be > 0, got -2.0"),
    ],
)
def test_each_objective_checks_its_own_settings(make, line):
    with pytest.raises(ValueError) as error:
        make()
    assert str(error.value) == line


def test_defaults_and_config_round_trip():
    assert PPOClip().init_args() == {"clip_eps": 0.2}
    assert GIPO().init_args() == {"sigma": 0.5, "clip_frac_eps": 0.2}
    assert SAPO().init_args() == {"tau_pos": 1.0, "tau_neg": 1.05, "clip_frac_eps": 0.2}
    for objective in (PPOClip(0.3), GIPO(sigma=0.2), SAPO(tau_neg=2.0)):
        assert as_objective(objective.config(), default=PPOClip) == objective
    assert GIPO(sigma=0.2) != GIPO(sigma=0.5) and GIPO() != SAPO()
    assert repr(GIPO(sigma=0.2)) == "GIPO(sigma=0.2, clip_frac_eps=0.2)"
    assert as_objective(None, default=GIPO) == GIPO()
    with pytest.raises(TypeError, match="--model.objective must be an Objective"):
        as_objective({"class_path": "torch.nn.Linear"}, default=PPOClip)
    refused = r"^--model.objective must be an Objective, e\.g\. --model.objective GIPO .*, got 'gipo'$"
    with pytest.raises(TypeError, match=refused):
        as_objective("gipo", default=PPOClip)  # a name, not a class
    with pytest.raises(TypeError, match="abstract"):
        Objective()  # the one method a new objective implements: loss


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "logprobs": torch.randn(16, generator=g) * 0.3 - 1.0,
        "old_logprobs": torch.full((16,), -1.0),
        "advantages": torch.randn(16, generator=g),
        "valid": torch.arange(16) < 13,
        "granularity": "token",
        "tokens_per_action": 1,
        "count": None,
    }


@pytest.mark.parametrize(("objective", "pure"), [(GIPO(sigma=0.3), gipo_loss), (SAPO(), sapo_loss)], ids=repr)
def test_clip_frac_eps_sets_only_the_diagnostic(objective, pure):
    """GIPO / SAPO have no clip: their ε only sets clip_frac, the fraction PPO would clip."""
    b = _batch()
    wide = type(objective)(**{**objective.init_args(), "clip_frac_eps": 0.5}).loss(**b)
    narrow = type(objective)(**{**objective.init_args(), "clip_frac_eps": 0.05}).loss(**b)
    assert torch.equal(wide[0], narrow[0])
    assert float(narrow[1]["clip_frac"]) > float(wide[1]["clip_frac"])
    pure_args = {k: v for k, v in objective.init_args().items() if k != "clip_frac_eps"}
    assert torch.equal(objective.loss(**b)[0], pure(**b, **pure_args)[0])


def _save(module: L.LightningModule, hparams: dict, path) -> str:
    """A checkpoint of ``module``'s weights whose hyperparameters are ``hparams``."""
    ckpt = {"state_dict": module.state_dict(), "hyper_parameters": hparams}
    torch.save({**ckpt, "pytorch-lightning_version": L.__version__}, path)
    return str(path)


def test_new_checkpoint_rebuilds_its_objective(tmp_path):
    module = RLModule(obs_dim=3, action_dim=2, objective=SAPO(tau_neg=2.0))
    module.configure_model()
    path = _save(module, dict(module.hparams), tmp_path / "new.ckpt")
    loaded = RLModule.load_from_checkpoint(path)
    assert loaded.objective == SAPO(tau_neg=2.0)
    assert RLModule.load_from_checkpoint(path, objective=PPOClip(0.3)).objective == PPOClip(0.3)  # yours wins
    assert loaded.hparams.objective == SAPO(tau_neg=2.0).config()


def test_vla_module_checkpoint_rebuilds_its_objective(tmp_path):
    torch.manual_seed(0)
    assert VLAModule(action_dim=4).objective == GIPO()  # VLAModule's default
    module = VLAModule(action_dim=4, objective=SAPO(tau_neg=3.0))
    module.configure_model()
    loaded = VLAModule.load_from_checkpoint(_save(module, dict(module.hparams), tmp_path / "vla.ckpt"))
    assert loaded.objective == SAPO(tau_neg=3.0)
    for key, value in module.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
