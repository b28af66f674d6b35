"""python -m switchzoo.tasks: the registered tasks, their sources and metrics."""
from switchzoo import tasks

print(tasks.describe())
