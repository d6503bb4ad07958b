"""The training side: the step loop (trainer), the objective table's trainer tasks (objectives), pretraining from
a recipe (pretrain) and distillation (distill). Fine-tuning a task runs the same trainer from bertkit.tasks.run."""
