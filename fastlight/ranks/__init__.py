"""What a multi-rank run needs beyond Lightning, used by the checkpoint callbacks: which rank is lost
(:mod:`~fastlight.ranks.peer_watch`), the processes that start ranks (:mod:`~fastlight.ranks.launcher`),
SLURM's requeue (:mod:`~fastlight.ranks.slurm`) and the state at an update's start
(:mod:`~fastlight.ranks.rollback`)."""
