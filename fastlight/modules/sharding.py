"""FSDP2 for the policy: ``--trainer.strategy fsdp2``, Lightning's own ``ModelParallelStrategy``.

Each transformer block the policy names (:class:`~fastlight.models.base.ShardsBlocks`) is one
``fully_shard`` unit, and the policy itself the root unit; the policy's own methods (``act``,
``evaluate``, ``value``, a flow policy's loss) are registered as FSDP forward methods. The strategy's 2-D
mesh (nodes x devices) shards within a node and replicates across nodes (HSDP). ``fsdp2`` is registered
with ``save_distributed_checkpoint=False``: checkpoints stay one file, gathered on rank 0.
"""

from __future__ import annotations

from torch import nn

STRATEGY_NAME = "fsdp2"


def forward_methods(policy: nn.Module) -> list[str]:
    """The policy methods a training step calls instead of ``forward`` (each must gather the shards)."""
    from fastlight.data.protocols import implements
    from fastlight.models.base import FlowPolicy

    return ["act", "evaluate", "value"] + (["flow_matching_loss"] if implements(policy, FlowPolicy) else [])


def register_strategy() -> None:
    """Register ``--trainer.strategy fsdp2`` with Lightning (idempotent)."""
    from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry

    if STRATEGY_NAME not in StrategyRegistry:
        StrategyRegistry.register(
            STRATEGY_NAME,
            ModelParallelStrategy,
            description="FSDP2 (fully_shard) of a fastlight policy: blocks and root sharded per node",
            save_distributed_checkpoint=False,
        )


def refuse_fsdp1(strategy: object) -> None:
    """Refuse Lightning's ``fsdp`` (FSDP1), given as a name or a strategy, in one line naming ``fsdp2``."""
    from lightning.pytorch.strategies import FSDPStrategy, StrategyRegistry

    if isinstance(strategy, str) and strategy in StrategyRegistry:
        strategy = StrategyRegistry[strategy]["strategy"]
    cls = strategy if isinstance(strategy, type) else type(strategy)
    if issubclass(cls, FSDPStrategy):
        raise ValueError(
            "--trainer.strategy fsdp (FSDP1) cannot run fastlight's update: it wraps the LightningModule "
            "in one root unit whose forward is training_step, and refuses the several backward passes an "
            f"update makes inside it; use --trainer.strategy {STRATEGY_NAME} (FSDP2, Lightning's "
            "ModelParallelStrategy: the policy's blocks are sharded one by one)"
        )


def block_classes(policy: nn.Module) -> set[type[nn.Module]]:
    """The classes of ``policy``'s transformer blocks (empty: the policy is a single unit)."""
    from fastlight.models.base import ShardsBlocks

    return policy.block_classes() if isinstance(policy, ShardsBlocks) else set()


def shard_policy(policy: nn.Module, mesh: object) -> list[str]:
    """Shard ``policy`` in place with FSDP2 over ``mesh``; returns the names of the block units."""
    from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

    if isinstance(policy, FSDPModule):
        return []
    classes = block_classes(policy)
    blocks = [(name, m) for name, m in policy.named_modules() if name and type(m) in classes]
    for _, block in blocks:  # children before the root: the root keeps what no block holds
        fully_shard(block, mesh=mesh)
    fully_shard(policy, mesh=mesh)
    for method in forward_methods(policy):
        register_fsdp_forward_method(policy, method)
    return [name for name, _ in blocks]


def is_sharded(policy: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in policy.modules())
