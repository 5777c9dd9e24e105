from wmrl.eval.loop import EvalResult, evaluate, evaluate_on_tasks, wilson_interval

__all__ = ["EvalResult", "evaluate", "evaluate_on_tasks", "wilson_interval"]
