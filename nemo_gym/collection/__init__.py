"""Collection: running rows through agents and what a run leaves behind.

``rollouts`` (one rollout: send, classify, ``RolloutFailedError``), ``helper`` (the trainer API:
``RolloutCollectionHelper``, ``RolloutAggregationHelper``), ``collector`` (a whole file collection),
``settings`` (the commands' arguments as NeMo Gym's config classes), ``commands`` (the ``ng_*``
collection commands), ``collection_io`` (the run's files, resume), ``output_lock``, ``aggregation``,
``metrics`` and ``streaming_metrics`` (aggregate metrics), ``aggregate_endpoint`` (the
``/aggregate_metrics`` endpoint), ``trackers`` (W&B, MLflow) and ``trajectory`` (``ng_trajectory``).
"""
