"""In-context learning tasks: each samples batches, scores outputs, and offers baselines.

    task = get_task("linear_regression", d_in=8, n_points=32)
    batch = task.sample(64, torch.Generator().manual_seed(0))
    metrics = task.evaluate(model(batch.inputs), batch)
"""

from . import arithmetic, documents, field, jsonl, regression, ruler  # noqa: F401  (importing registers the tasks; documents, jsonl,
# field (squad, hotpotqa) and ruler their episodes)
from .amicl import AMICLConfig, AMICLTask  # importing registers "amicl"
from .arithmetic import Arithmetic, ArithmeticConfig
from .base import Batch, Predictor, Task
from .bbc_news import BBCNews, BBCNewsConfig  # importing registers "bbc-news"
from .bursty import BurstyConfig, BurstyTask  # importing registers "bursty"
from .induction import Induction, InductionConfig, split_prompt  # importing registers "induction"
from .registry import get_task, list_tasks, register_task
from .stories import Stories, StoriesConfig  # importing registers "stories"
from .text import Shakespeare, ShakespeareConfig  # importing registers "shakespeare"
from .topic_mixture import TopicMixture, TopicMixtureConfig  # importing registers "topic_mixture"
from .regression import LeastSquares, LinearRegression, LinearRegressionConfig, Ridge, error_by_examples

__all__ = [
    "AMICLConfig",
    "AMICLTask",
    "Batch",
    "BBCNews",
    "BBCNewsConfig",
    "BurstyConfig",
    "BurstyTask",
    "Predictor",
    "Task",
    "get_task",
    "list_tasks",
    "register_task",
    "Arithmetic",
    "ArithmeticConfig",
    "Induction",
    "InductionConfig",
    "split_prompt",
    "Shakespeare",
    "Stories",
    "StoriesConfig",
    "ShakespeareConfig",
    "TopicMixture",
    "TopicMixtureConfig",
    "LinearRegression",
    "LinearRegressionConfig",
    "LeastSquares",
    "Ridge",
    "error_by_examples",
]
