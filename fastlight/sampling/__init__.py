"""What runs inside a sampler: the collector, rows, observations, the sampler loop, the auto threshold,
task weights and the rank's round signal. Nothing here imports the trainer's side (``fastlight.fleet``).

A new reset mode touches two files: :mod:`~fastlight.sampling.collector_settings` (its name in
``ResetMode`` and what it is in ``RESET_MODES``, which every other site reads) and
:mod:`~fastlight.sampling.collector` (how it steps, where the table does not already say)."""
