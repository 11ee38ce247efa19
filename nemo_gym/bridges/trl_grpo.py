"""TRL's GRPO trainer on CPU for a small policy: the settings this project trains with.

``scripts/train_trl.py``, ``scripts/train_trl_agent.py`` and the tests that train through TRL
build the same trainer: on CPU, one prompt group per step (the batch is one group of
``generations`` completions), temperature 1.0, no KL term (``beta=0``), a log entry every step,
no checkpoints, no reporting, no progress bar. What differs between them (the reward, a
``rollout_func`` or an ``environment_factory``) is passed through. ``trl``, ``transformers`` and
the model load only when a trainer is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def cpu_grpo_trainer(
    model_path: str | Path,
    dataset: Any,
    reward_funcs: Any,
    *,
    output_dir: str | Path,
    steps: int,
    generations: int,
    max_completion_length: int,
    learning_rate: float = 3e-3,
    seed: int = 0,
    **trainer_kwargs: Any,
) -> Any:
    """A ``trl.GRPOTrainer`` over the model at ``model_path`` (and its tokenizer) for ``steps``
    steps of ``generations`` completions each; ``trainer_kwargs`` go to the trainer
    (``rollout_func``, ``environment_factory``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        seed=seed,
        max_steps=steps,
        learning_rate=learning_rate,
        per_device_train_batch_size=generations,
        num_generations=generations,
        max_completion_length=max_completion_length,
        temperature=1.0,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    return GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_path),
        processing_class=AutoTokenizer.from_pretrained(model_path),
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=dataset,
        **trainer_kwargs,
    )
