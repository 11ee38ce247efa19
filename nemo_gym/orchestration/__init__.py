"""Past one machine on Slurm: ``gym eval submit`` with NeMo Gym 0.7.0's submit config, the job
record, status, logs, cancel and resume. See docs/SCALING.md."""
