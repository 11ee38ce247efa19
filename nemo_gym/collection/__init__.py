"""Collection: the files of a rollout collection, the output lock, aggregate metrics (batch and
streaming), and the ``/aggregate_metrics`` endpoint."""
