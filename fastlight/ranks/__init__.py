"""What a multi-rank run needs beyond Lightning: which rank is lost, the launched ranks, SLURM's requeue
and the state at an update's start."""
