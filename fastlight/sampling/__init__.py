"""What runs inside a sampler: the collector, rows, observations, the sampler loop, the auto threshold,
task weights and the rank's round signal. Nothing here imports the trainer's side (``fastlight.fleet``)."""
