"""The default policy over the env's spaces: the descriptions, the factorised action heads against a naive
per-entry loop, the Nature-CNN's layout handling and the parts' encodings."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Bernoulli, Categorical

from fastlight.models.action_heads import ActionHead
from fastlight.models.cnn import NatureCNN, channels_first
from fastlight.models.multi_input import MultiInputActorCritic
from fastlight.models.spaces import describe_spaces, refusal
from fastlight.sampling.obs import obs_to_tensor, stack_obs

TOL = {"atol": 1e-5, "rtol": 1e-5}  # float32 sums of a few log-probs
IMAGE = gym.spaces.Box(0, 255, (40, 40, 3), np.uint8)


def test_multidiscrete_log_prob_and_entropy_are_the_sums_of_per_entry_categoricals():
    torch.manual_seed(0)
    head = ActionHead("multidiscrete", (3, 2, 4))
    out = torch.randn(6, 9)
    actions, logprobs = head.sample(out)
    assert actions.shape == (6, 3) and actions.dtype == torch.long
    naive_lp = torch.zeros(6)
    naive_ent = torch.zeros(6)
    for n in range(6):
        start = 0
        for j, k in enumerate((3, 2, 4)):
            dist = Categorical(logits=out[n, start : start + k])
            naive_lp[n] += dist.log_prob(actions[n, j])
            naive_ent[n] += dist.entropy()
            start += k
    torch.testing.assert_close(logprobs, naive_lp, **TOL)
    torch.testing.assert_close(head.log_prob(out, actions), naive_lp, **TOL)
    torch.testing.assert_close(head.entropy(out), naive_ent, **TOL)
    assert all(0 <= actions[:, j].min() and actions[:, j].max() < k for j, k in enumerate((3, 2, 4)))


def test_multibinary_log_prob_and_entropy_are_the_sums_of_per_bit_bernoullis():
    torch.manual_seed(1)
    head = ActionHead("multibinary", (5,))
    out = torch.randn(4, 5)
    actions, logprobs = head.sample(out)
    assert actions.shape == (4, 5) and set(actions.unique().tolist()) <= {0, 1}
    naive_lp = torch.stack([sum(Bernoulli(logits=out[n, i]).log_prob(actions[n, i].float()) for i in range(5))
                            for n in range(4)])  # fmt: skip
    naive_ent = torch.stack([sum(Bernoulli(logits=out[n, i]).entropy() for i in range(5)) for n in range(4)])
    torch.testing.assert_close(logprobs, naive_lp, **TOL)
    torch.testing.assert_close(head.entropy(out), naive_ent, **TOL)
    greedy, _ = head.sample(out, deterministic=True)
    assert torch.equal(greedy, (out > 0).long())


def test_discrete_and_box_heads_match_the_mlp_policys_distributions():
    torch.manual_seed(2)
    out = torch.randn(5, 3)
    actions, lp = ActionHead("discrete", (3,)).sample(out)
    assert actions.shape == (5,)
    torch.testing.assert_close(lp, Categorical(logits=out).log_prob(actions), **TOL)
    box = ActionHead("box", (3,), init_log_std=-0.5)
    actions, lp = box.sample(out)
    want = torch.distributions.Normal(out, torch.full_like(out, -0.5).exp()).log_prob(actions).sum(-1)
    torch.testing.assert_close(lp, want, **TOL)
    clipped = box.action_mapping()(torch.tensor([[3.0, -3.0, 0.5]]))
    assert torch.equal(clipped, torch.tensor([[1.0, -1.0, 0.5]]))


@pytest.mark.parametrize(
    ("shape", "first"), [((64, 64, 3), False), ((3, 64, 64), True), ((4, 84, 84), True), ((84, 84, 1), False)]
)
def test_channels_order_is_read_from_the_shape(shape, first):
    assert channels_first(shape) is first


def test_the_cnn_sees_the_same_pixels_in_either_layout():
    torch.manual_seed(3)
    hwc = NatureCNN((40, 40, 3))
    chw = NatureCNN((3, 40, 40))
    chw.load_state_dict(hwc.state_dict())
    images = torch.randint(0, 256, (2, 40, 40, 3), dtype=torch.uint8)
    out = hwc(images)
    assert out.shape == (2, 512)
    torch.testing.assert_close(chw(images.permute(0, 3, 1, 2)), out, **TOL)
    # uint8 scaled to [0, 1]: the first conv sees values at most 1
    seen = []
    hwc.convs[0].register_forward_hook(lambda m, i, o: seen.append(float(i[0].max())))
    hwc(torch.full((1, 40, 40, 3), 255, dtype=torch.uint8))
    assert seen == [pytest.approx(1.0)]


def test_descriptions_pick_the_mlp_for_vectors_only():
    vec, act = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2)
    assert describe_spaces(vec, act) is None
    assert describe_spaces(vec, gym.spaces.Box(-1, 1, (2,))) is None
    assert describe_spaces(IMAGE, act) == {"obs": {"": "image 40x40x3"}, "action": "discrete 2"}
    # a float image (not uint8 in [0, 255]) is a vector, as SB3's is_image_space says
    assert describe_spaces(gym.spaces.Box(0, 1, (40, 40, 3)), act) is None
    multi = describe_spaces(vec, gym.spaces.MultiDiscrete([3, 3]))
    assert multi == {"obs": {"": "box 4"}, "action": "multidiscrete 3x3"}
    tup = describe_spaces(gym.spaces.Tuple((gym.spaces.Discrete(5), vec)), gym.spaces.MultiBinary(3))
    assert tup == {"obs": {"0": "discrete 5", "1": "box 4"}, "action": "multibinary 3"}


def test_a_part_no_policy_takes_is_refused_naming_it_and_the_wrapper():
    space = gym.spaces.Dict({"mission": gym.spaces.Text(8), "x": gym.spaces.Box(-1, 1, (2,))})
    with pytest.raises(
        ValueError, match=r"'mission' is Text\(.*FilterObservation, init_args: \{filter_keys: \[x\]\}"
    ):
        describe_spaces(space, gym.spaces.Discrete(2))
    nested = gym.spaces.Dict({"a": gym.spaces.Dict({"b": gym.spaces.Discrete(2)})})
    with pytest.raises(ValueError, match="'a' is Dict.*FlattenObservation"):
        describe_spaces(nested, gym.spaces.Discrete(2))
    # An image too small for the Nature-CNN is refused only when the default policy is built.
    spaces = describe_spaces(gym.spaces.Box(0, 255, (16, 16, 3), np.uint8), gym.spaces.Discrete(2))
    small = refusal(spaces)
    assert "16x16x3 image" in small and "ResizeObservation" in small, small
    assert refusal(describe_spaces(IMAGE, gym.spaces.Discrete(2))) is None
    with pytest.raises(ValueError, match="Dict.*not supported.*MultiDiscrete or MultiBinary"):
        describe_spaces(IMAGE, gym.spaces.Dict({"a": gym.spaces.Discrete(2)}))


def test_the_multi_input_policy_encodes_every_part_and_scores_its_own_actions():
    space = gym.spaces.Dict({"px": IMAGE, "pos": gym.spaces.Box(-1, 1, (4,)), "mode": gym.spaces.Discrete(3)})
    spaces = describe_spaces(space, gym.spaces.MultiDiscrete([3, 2]))
    torch.manual_seed(4)
    policy = MultiInputActorCritic(spaces)
    space.seed(0)
    obs = obs_to_tensor(stack_obs([space.sample() for _ in range(6)]))
    feats = policy.features(obs)
    assert feats.shape == (6, 3 + 4 + 512)  # one-hot mode, pos, CNN (keys in the space's order)
    torch.testing.assert_close(feats[:, :3], torch.nn.functional.one_hot(obs["mode"], 3).float(), **TOL)
    out = policy.act(obs)
    assert out.actions.shape == (6, 2) and out.logprobs.shape == (6,) and out.values.shape == (6,)
    ev = policy.evaluate(obs, out.actions)
    torch.testing.assert_close(ev.logprobs, out.logprobs, **TOL)
    assert ev.entropy.shape == (6,) and bool((ev.entropy > 0).all())
    ev.logprobs.sum().backward()  # gradients reach the CNN through the shared features
    assert policy.cnns["2"].convs[0].weight.grad.abs().sum() > 0


def test_rl_module_builds_the_policy_its_spaces_ask_for_and_checks_an_injected_one():
    from fastlight.data.env_spec import EnvSpec
    from fastlight.models.mlp import MLPActorCritic
    from fastlight.modules.rl_module import RLModule

    spaces = describe_spaces(IMAGE, gym.spaces.Box(-1, 1, (3,)))
    module = RLModule(obs_dim=40 * 40 * 3, action_dim=3, continuous=True, spaces=spaces)
    module.configure_model()
    assert isinstance(module.policy, MultiInputActorCritic)  # not behind observation normalisation
    assert module.normalization() == (False, False)
    assert isinstance(RLModule(obs_dim=4, action_dim=2).build_policy(), MLPActorCritic)
    injected = RLModule(policy=MultiInputActorCritic(spaces))
    other = describe_spaces(IMAGE, gym.spaces.MultiDiscrete([3, 3]))
    with pytest.raises(
        ValueError, match="--model.policy.init_args.spaces=.* does not match the env's spaces="
    ):
        injected.check_env_spec(EnvSpec(40 * 40 * 3, 2, False, spaces=other))
    injected.check_env_spec(EnvSpec(40 * 40 * 3, 3, True, spaces=spaces))
    small = describe_spaces(gym.spaces.Box(0, 255, (16, 16, 3), np.uint8), gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="16x16x3 image, smaller than the Nature-CNN's 36x36"):
        RLModule(obs_dim=768, action_dim=2, spaces=small)
