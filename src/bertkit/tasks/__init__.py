"""Fine-tuning tasks, one file per family (classify, glue, ner, squad, swag), each whole: reading, features, head
choice, loss, evaluation, prediction, the predictions file; `family_for(kind)` finds a kind's family (tasks/base.py).
Importing any of them needs no torch."""

from bertkit.tasks.base import KINDS, TASK_MODULES, TaskFamily, family_for, register

__all__ = ["KINDS", "TASK_MODULES", "TaskFamily", "family_for", "register"]
